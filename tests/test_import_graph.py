"""tfdpbnn's import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` in a module counts, at module level and inside functions, absolute
and relative. ``import a.b.c`` and ``from a.b import c`` are edges to the module ``a.b.c`` when it exists,
else to the package ``a.b`` (its ``__init__``); the parent packages Python runs on the way are counted only
where said (every module would otherwise reach ``tfdpbnn/__init__.py``, which imports the public names).

Asserted: no import cycle among tfdpbnn modules, also when the package ``__init__`` files Python runs on
the way count as edges; every import goes down tfdpbnn's import layers (``LAYERS``); the record package
(``tfdpbnn/record``) imports only the accounting and validation modules, never the optimizers, callbacks,
uncertainty, audit or commands that write or read it; the record's private attributes on optimizers,
models, layers and datasets are spelled only in ``tfdpbnn/record/attributes.py``; every module is named in
docs/architecture.md.
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
from tfdpbnn.optimizers import mechanism as m, DPMechanism


def f():
    from tfdpbnn.record.store import transaction
    import tfdpbnn.record.records as r
"""
    found = {(t, inside) for t, _, inside in _imports("tfdpbnn.optimizers.base", source)}
    assert found == {("tfdpbnn.privacy.budget", False), ("tfdpbnn.optimizers.mechanism", False),
                     ("tfdpbnn._validation", False), ("tfdpbnn.record.ledger", False),
                     ("tfdpbnn.optimizers", False),
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


def _package_edges(function_level: bool = True) -> dict[str, set[str]]:
    """What each import runs: the target and the package ``__init__`` files on the way."""
    return {m: {r for t, _, inside in imports if function_level or not inside for r in _runs(m, t)}
            for m, imports in GRAPH.items()}


def test_no_import_cycle_counting_package_init_files():
    """With the ``__init__`` files Python runs on the way (every import, inside functions too), no module
    needs itself: no strongly connected group at all (``tfdpbnn/optimizers/__init__.py`` loads every
    optimizer, so a layer that imported ``tfdpbnn.optimizers.<anything>`` would close one)."""
    assert _runs("tfdpbnn.layers.noisy", "tfdpbnn.optimizers.mechanism") == [
        "tfdpbnn.optimizers.mechanism", "tfdpbnn.optimizers"]
    edges = _package_edges()
    assert "tfdpbnn.privacy" in edges["tfdpbnn.layers.noisy"]  # its noise: tfdpbnn.privacy.noise
    cycles = _cycles(edges)
    detail = {tuple(c): sorted(f"{m} -> {t} (line {line})" for m in c for t, line, _ in GRAPH[m]
                               if set(_runs(m, t)) & set(c)) for c in cycles}
    assert cycles == [], detail


#: tfdpbnn's import layers, lowest first, by top-level module or package under ``tfdpbnn/`` (``""``: the
#: package's own ``__init__``): accounting, noise, the record and the low-level pieces; what a DP ``fit`` is
#: made of (layers, their clipping rules, the preprocessing checks, the callbacks a DP fit installs); the
#: optimizers; and what uses a trained model or drives training. docs/architecture.md, "Import layers".
LAYERS = (
    ("_adapters", "_audit_hook", "_keras_version", "_private_api", "_validation", "data", "privacy",
     "record"),
    ("callbacks", "clipping", "layers", "preprocessing"),
    ("optimizers",),
    ("", "audit", "cli", "commands", "export", "public", "tuning", "uncertainty"),
)


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    found = [i for i, names in enumerate(LAYERS) if top in names]
    assert len(found) == 1, f"{module}: its top-level name {top!r} must be in exactly one of LAYERS"
    return found[0]


def _upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets if _layer(t) > _layer(m))


def test_imports_go_down_the_layers():
    """Every import (module level or inside a function, with the package ``__init__`` files on the way) goes
    to the same layer or a lower one: the layers and clipping rules import no optimizer, and the optimizers
    no uncertainty, tuning, export, audit or command module. Every module has a layer."""
    assert _upward(_package_edges()) == []
    upward = _upward({"tfdpbnn.layers.noisy": {"tfdpbnn.optimizers"},
                      "tfdpbnn.optimizers.base": {"tfdpbnn.uncertainty.regression", "tfdpbnn.record"}})
    assert upward == ["tfdpbnn.layers.noisy -> tfdpbnn.optimizers",
                      "tfdpbnn.optimizers.base -> tfdpbnn.uncertainty.regression"]  # the check can fail
    found = {top for m in MODULES for top in [m.split(".")[1] if "." in m else ""]}
    assert found == {name for names in LAYERS for name in names}  # no stale name in LAYERS


def test_layers_and_clipping_import_nothing_above_them():
    """Named directly, inside functions too: ``tfdpbnn.layers`` and ``tfdpbnn.clipping`` import nothing from
    the optimizers, uncertainty, callbacks or commands (their only imports of tfdpbnn are below them)."""
    above = ("tfdpbnn.optimizers", "tfdpbnn.uncertainty", "tfdpbnn.callbacks", "tfdpbnn.commands",
             "tfdpbnn.audit", "tfdpbnn.tuning", "tfdpbnn.export", "tfdpbnn.public")
    bad = sorted(f"{m} -> {t} (line {line})" for m, imports in GRAPH.items()
                 if m.startswith(("tfdpbnn.layers", "tfdpbnn.clipping"))
                 for t, line, _ in imports for r in _runs(m, t)
                 if any(r == a or r.startswith(a + ".") for a in above))
    assert bad == []


def test_loading_the_record_loads_no_writer_or_reader():
    """Module-level imports of the record, with the package ``__init__`` files Python runs on the way
    (except ``tfdpbnn/__init__.py``), reach no optimizer, callback, uncertainty, audit or command module."""
    edges = _package_edges(function_level=False)
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
