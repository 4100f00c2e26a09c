"""The API reference builds from the docstrings with pdoc, with every pdoc warning an error (docs/api.md)."""

import pathlib
import warnings

import pdoc  # in the test extra of setup.cfg
import pytest

import tfdpbnn


@pytest.mark.slow
def test_api_reference_builds_without_warnings(tmp_path):
    package = pathlib.Path(tfdpbnn.__file__).parent
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(package, output_directory=tmp_path)
    from_pdoc = [f"{w.category.__name__}: {w.message}" for w in caught if "pdoc" in (w.filename or "")]
    assert not from_pdoc, "\n".join(from_pdoc)
    pages = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html")}
    for module in ("tfdpbnn/layers", "tfdpbnn/optimizers", "tfdpbnn/privacy", "tfdpbnn/uncertainty"):
        assert f"{module}.html" in pages
    layers = (tmp_path / "tfdpbnn" / "layers.html").read_text(encoding="utf-8")
    assert "DenseVariational" in layers and "Ermis &amp; Cemgil" in layers  # docstrings rendered
