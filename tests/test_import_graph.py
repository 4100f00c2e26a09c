"""tfdpbnn's import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` in a module counts, at module level and inside functions, absolute
and relative. ``import a.b.c`` and ``from a.b import c`` are edges to the module ``a.b.c`` when it exists,
else to the package ``a.b`` (its ``__init__``); the parent packages Python runs on the way are not counted
(every module would otherwise reach ``tfdpbnn/__init__.py``, which imports the public names).

Asserted: no import cycle among tfdpbnn modules; the record package (``tfdpbnn/record``) imports only the
accounting and validation modules, never the optimizers, callbacks, uncertainty, audit or commands that
write or read it; the record's private attributes on optimizers, models, layers and datasets are spelled
only in ``tfdpbnn/record/attributes.py``; every module is named in docs/architecture.md.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdpbnn"

# What the record package may import: itself, the accountants and budget (with the RDP orders and conversion
# of a private search's curve), the argument checks, and the private-API layer (Keras and tf.data private
# names) with its per-Keras adapters.
RECORD_MAY_IMPORT = ("tfdpbnn.record", "tfdpbnn.privacy", "tfdpbnn._validation", "tfdpbnn._private_api",
                     "tfdpbnn._adapters", "tfdpbnn._keras_version")


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every module under tfdpbnn/."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module ``name`` imports: itself when it is a module, else its closest enclosing package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, source: str | None = None) -> list[tuple[str, int, bool]]:
    """``(imported tfdpbnn module, line, inside a function)`` for every import statement of ``module``.

    ``source``: the module's text (default: its file's).
    """
    path = MODULES[module]
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        for target in targets:
            if target == "tfdpbnn" or target.startswith("tfdpbnn."):
                resolved = _resolve(target)
                if resolved is not None and resolved != module:
                    found.append((resolved, node.lineno, id(node) in in_function))
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan 1972), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _edges(function_level: bool) -> dict[str, set[str]]:
    return {m: {t for t, _, inside in imports if function_level or not inside}
            for m, imports in GRAPH.items()}


def test_graph_reads_imports_of_every_kind():
    """The reader sees module-level, function-level, relative and ``from package import module`` imports."""
    source = """
import numpy
import tfdpbnn.privacy.budget
from . import mechanism
from .. import _validation
from ..record import ledger
from tfdpbnn.optimizers import noise, DPMechanism


def f():
    from tfdpbnn.record.store import transaction
    import tfdpbnn.record.records as r
"""
    found = {(t, inside) for t, _, inside in _imports("tfdpbnn.optimizers.base", source)}
    assert found == {("tfdpbnn.privacy.budget", False), ("tfdpbnn.optimizers.mechanism", False),
                     ("tfdpbnn._validation", False), ("tfdpbnn.record.ledger", False),
                     ("tfdpbnn.optimizers.noise", False), ("tfdpbnn.optimizers", False),
                     ("tfdpbnn.record.store", True), ("tfdpbnn.record.records", True)}
    package = {t for t, _, _ in _imports("tfdpbnn.privacy", "from .budget import calibrate_noise")}
    assert package == {"tfdpbnn.privacy.budget"}  # relative to the package itself in an __init__
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_module_level():
    assert _cycles(_edges(function_level=False)) == []


def test_no_import_cycle_counting_function_level_imports():
    """A function-level import only hides a cycle from the interpreter: the modules still need each other."""
    cycles = _cycles(_edges(function_level=True))
    detail = {tuple(c): sorted(f"{m} -> {t} (line {line})" for m in c for t, line, _ in GRAPH[m] if t in c)
              for c in cycles}
    assert cycles == [], detail


def test_record_package_imports_only_accounting():
    """The DP step writes the record and everything else reads it: the record imports none of them."""
    bad = sorted(f"{m} -> {t} (line {line})" for m, imports in GRAPH.items()
                 if m == "tfdpbnn.record" or m.startswith("tfdpbnn.record.")
                 for t, line, _ in imports
                 if not any(t == p or t.startswith(p + ".") for p in RECORD_MAY_IMPORT))
    assert bad == []
    assert "tfdpbnn.record.statement" in MODULES and "tfdpbnn.record.ledger" in MODULES


def test_every_module_is_named_in_architecture_doc():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(str(path.relative_to(ROOT)) for path in MODULES.values()
                     if str(path.relative_to(ROOT)) not in text)
    assert missing == []


def test_record_attributes_are_named_only_by_their_accessors():
    """Every private attribute the record keeps on objects is spelled in ``record/attributes.py`` alone."""
    tree = ast.parse(MODULES["tfdpbnn.record.attributes"].read_text())
    names = {node.value.value for node in tree.body
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str) and node.value.value.startswith("_")}
    assert {"_dp_record", "_tfdpbnn_ledger_link", "_tfdpbnn_record_keys"} <= names
    spelled = sorted(f"{path.relative_to(ROOT)}: {name}"
                     for module, path in MODULES.items() if module != "tfdpbnn.record.attributes"
                     for name in names if re.search(rf"\b{name}\b", path.read_text()))
    assert spelled == []


def _runs(module: str, target: str) -> list[str]:
    """``target`` and the packages whose ``__init__`` Python runs to import it from ``module``.

    ``tfdpbnn/__init__.py`` (it imports the public names) and the packages ``module`` is inside (already
    run) are left out.
    """
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [target] + [p for p in parents if not (module == p or module.startswith(p + "."))]


#: The one strongly connected group left when package ``__init__`` files count as edges, and the imports
#: that hold it: ``layers/noisy.py`` draws its noise with ``tfdpbnn.optimizers.noise`` and
#: ``preprocessing/checks.py`` reads ``tfdpbnn.optimizers.state_checks.declared_state``, each running
#: ``optimizers/__init__`` and so ``optimizers/base`` (which imports ``clipping``, ``preprocessing``...).
#: Moving ``noise.py`` and ``declared_state`` out of the optimizers package breaks it; shrink this then.
KNOWN_PACKAGE_GROUP = sorted(
    [f"tfdpbnn.{m}" for m in (
        "clipping", "clipping.rules", "layers", "layers.noisy", "optimizers", "optimizers.base",
        "optimizers.dpsgd", "optimizers.dpsgld", "optimizers.dpvd", "optimizers.mechanism",
        "optimizers.sidp", "preprocessing", "preprocessing.checks", "uncertainty",
        "uncertainty.calibration", "uncertainty.calibration_plan", "uncertainty.conformal",
        "uncertainty.mc", "uncertainty.outputs", "uncertainty.regression", "uncertainty.temperature",
    )])


def test_package_init_files_count_as_edges_and_no_group_holds_the_record():
    """With the ``__init__`` files Python runs on the way (every import, inside functions too): the record
    and the tuning package are in no import circle, and no circle beyond the known group exists."""
    edges = {m: {r for t, _, _ in imports for r in _runs(m, t)} for m, imports in GRAPH.items()}
    assert "tfdpbnn.optimizers" in edges["tfdpbnn.layers.noisy"]  # through tfdpbnn.optimizers.noise
    assert _runs("tfdpbnn.record.store", "tfdpbnn.optimizers.noise") == ["tfdpbnn.optimizers.noise",
                                                                        "tfdpbnn.optimizers"]
    cycles = _cycles(edges)
    in_record = sorted(m for c in cycles for m in c if m.startswith(("tfdpbnn.record", "tfdpbnn.tuning")))
    assert in_record == []
    assert cycles == [KNOWN_PACKAGE_GROUP], cycles


def test_loading_the_record_loads_no_writer_or_reader():
    """Module-level imports of the record, with the package ``__init__`` files Python runs on the way
    (except ``tfdpbnn/__init__.py``), reach no optimizer, callback, uncertainty, audit or command module."""
    edges = {m: {r for t, _, inside in imports if not inside for r in _runs(m, t)}
             for m, imports in GRAPH.items()}
    seen, todo = set(), [m for m in MODULES if m.startswith("tfdpbnn.record")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges.get(module, ()))
    forbidden = ("tfdpbnn.optimizers", "tfdpbnn.callbacks", "tfdpbnn.uncertainty", "tfdpbnn.audit",
                 "tfdpbnn.commands")
    assert sorted(m for m in seen if any(m == f or m.startswith(f + ".") for f in forbidden)) == []
    assert "tfdpbnn.privacy.budget" in seen  # the walk does follow the record's imports
