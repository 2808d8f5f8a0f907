"""The shape of the house, checked statically: ptestore's modules import one another
without a loop, lazy imports included; the layers import types, not implementations; no
floor imports a higher one (:data:`FLOORS`); no module takes another's private name or
grows over :data:`MAX_LINES` lines.

The graph is built from the source with :mod:`ast` (nothing is imported): an edge for
every ``import``/``from ... import`` anywhere in a module (module level, inside
functions, under ``TYPE_CHECKING``), plus the package root's lazy export table. Importing
``a.b.c`` from outside ``a.b`` also runs ``a/__init__`` and ``a/b/__init__``: those
parents are edges too, except a package the importer itself lives in (it is already
being imported), unless a name is read from that package (``from .. import name``), which
is exactly how a lazy loop closes.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import ptestore

ROOT = Path(ptestore.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _resolve(module: str, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if module in PACKAGES else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _targets(module: str, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(module, node.level, node.module)
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        # ``from . import sibling`` reads nothing from the (half-imported) package.
        if not (_within(module, base) and len(subs) == len(node.names)):
            yield base
        yield from subs


def _lazy_exports() -> set[str]:
    """The modules named in the package root's ``_LAZY`` table."""
    tree = ast.parse(MODULES["ptestore"].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets
        ):
            assert isinstance(node.value, ast.Dict)
            out = set()
            for value in node.value.values:
                assert isinstance(value, ast.Constant) and isinstance(value.value, str)
                out.add(_resolve("ptestore", 1, value.value.lstrip(".")))
            return out
    raise AssertionError("ptestore/__init__.py has no _LAZY table")


def import_graph() -> dict[str, set[str]]:
    """Module -> the ptestore modules it may import (see the module docstring)."""
    return {k: set(v) for k, v in _graph().items()}


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(module, node):
                if target not in MODULES:
                    continue  # not ptestore's
                out.add(target)
                parts = target.split(".")
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if not _within(module, parent):
                        out.add(parent)
        out.discard(module)
        graph[module] = out
    graph["ptestore"] |= _lazy_exports()
    return {k: frozenset(v) for k, v in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    # module level, relative
    assert "ptestore.storage.types" in graph["ptestore.format.reader"]
    # inside a function
    assert "ptestore._version" in graph["ptestore.provenance.stamp"]
    # the root's lazy exports
    assert "ptestore.coordinator" in graph["ptestore"]
    # a parent package runs before its module
    assert "ptestore.writers" in graph["ptestore.gc"]


def test_a_loop_is_found() -> None:
    """The loop this test was written for: the provenance stamp read ``__version__``
    from the package root, whose lazy exports import the coordinator, the pipeline and
    the provenance package (``ptestore -> coordinator -> pipeline -> provenance ->
    stamp -> ptestore``)."""
    graph = import_graph()
    graph["ptestore.provenance.stamp"].add("ptestore")
    loops = _cycles(graph)
    assert len(loops) == 1
    assert {"ptestore", "ptestore.coordinator", "ptestore.provenance.stamp"} <= set(loops[0])


def test_no_import_loop_lazy_ones_included() -> None:
    assert _cycles(import_graph()) == []


def test_types_come_from_the_types_module_not_from_implementations() -> None:
    graph = import_graph()
    # The storage types need nothing of ptestore's but its errors and how a value is
    # shown (to refuse a NUL in a name) and what a URL shows (its credentials redacted),
    # all the standard library only themselves (the errors also with the file-name
    # limits an ENAMETOOLONG names, likewise), and the check of a path argument (a
    # URL given as None or bytes, named).
    assert graph["ptestore.storage.types"] == {
        "ptestore.errors",
        "ptestore._text",
        "ptestore._redact",
        "ptestore._args",
    }
    assert graph["ptestore._args"] <= {"ptestore._text", "ptestore.errors"}
    assert graph["ptestore.errors"] <= {"ptestore._text", "ptestore._names", "ptestore._redact"}
    assert graph["ptestore._redact"] == set()
    assert graph["ptestore._names"] <= {"ptestore._text"} and graph["ptestore._text"] == set()
    # format/, the writer contract and provenance take DataLoader from there, never from
    # the loader implementations (fsspec) at import time.
    for module, path in MODULES.items():
        if (
            _within(module, "ptestore.format")
            or _within(module, "ptestore.provenance")
            or (module == "ptestore.writers.base")
        ):
            top = ast.parse(path.read_text()).body
            assert not any("ptestore.storage.loaders" in _targets(module, n) for n in top), module
    # writers/ does not sit on format/ (alignment helpers live in ptestore._align).
    for module in MODULES:
        if _within(module, "ptestore.writers"):
            assert not any(_within(t, "ptestore.format") for t in graph[module]), module
    # gc is not a writer: writers/ never imports it (ptestore.writers.gc is the old
    # path, a deprecated alias of ptestore.gc that nothing in ptestore imports).
    for module in MODULES:
        if _within(module, "ptestore.writers") and module != "ptestore.writers.gc":
            assert "ptestore.gc" not in graph[module], module
            assert "ptestore.writers.gc" not in graph[module], module


#: Modules that exist to be imported for their types (and cost nothing to import).
TYPE_MODULES = {"ptestore.storage.types", "ptestore.format.model", "ptestore.errors"}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _type_only_imports(module: str, tree: ast.Module) -> list[str]:
    """Modules of another of ptestore's packages that ``module`` imports at run time
    only for names it uses in annotations (which ``from __future__ import annotations``
    never evaluates)."""
    in_annotations: set[int] = set()
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations.append(node.returns)
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if arg is not None:
                    annotations.append(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in annotations:
            if annotation is not None:
                in_annotations.update(id(n) for n in ast.walk(annotation))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in in_annotations}
    exported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported = {
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    own_package = ".".join(module.split(".")[:2])
    found = []
    for node in tree.body:  # module level, outside ``if TYPE_CHECKING:``
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        source = _resolve(module, node.level, node.module)
        if source in TYPE_MODULES or _within(source, own_package):
            continue
        names = {a.asname or a.name for a in node.names}
        if not names & (used | exported):
            found.append(f"{module} imports {source} for {sorted(names)} (types only)")
    return found


def test_no_module_imports_another_package_for_a_type_alone() -> None:
    """A name used only in annotations comes from a types module or under
    ``if TYPE_CHECKING:``: importing ``writers.base`` for ``DataWriter`` would run
    ``writers/__init__`` (and fsspec) for a name nothing evaluates."""
    found = []
    for module, path in MODULES.items():
        found += _type_only_imports(module, ast.parse(path.read_text(), str(path)))
    assert found == []


def _unnamed_modules(doc: str) -> list[str]:
    """Modules a document names neither by path nor by file name on a line that names
    their package's directory."""
    lines = doc.splitlines()
    missing = []
    for path in MODULES.values():
        rel = path.relative_to(ROOT.parent).as_posix()
        directory = path.parent.relative_to(ROOT.parent).as_posix() + "/"
        top = "/".join(directory.split("/")[:2]) + "/"
        if directory == "ptestore/":
            named = rel in doc
        elif path.name == "__init__.py":  # a package: its directory
            name = path.parent.name + "/"
            named = any(directory in line or (top in line and name in line) for line in lines)
        else:
            named = rel in doc or any(top in line and path.name in line for line in lines)
        if not named and path.name != "__main__.py":
            missing.append(rel)
    return missing


def test_every_module_is_named_in_the_architecture_document() -> None:
    """docs/architecture.md names every module: by its path, or by its file name on a
    line that names its package's directory (the package's row of the table)."""
    assert _unnamed_modules((ROOT.parent / "docs" / "architecture.md").read_text()) == []


def test_every_module_and_its_tests_are_in_the_testing_document() -> None:
    """docs/testing.md's table says where each module's tests are."""
    doc = (ROOT.parent / "docs" / "testing.md").read_text()
    table = doc[doc.index("## Where the tests of a module are") :]
    table = table[: table.index("\n## ", 1)]
    assert _unnamed_modules(table) == []
    for test_file in re.findall(r"`(tests/[\w/]+\.py)`", table):
        assert (ROOT.parent / test_file).is_file(), test_file


# ---------------------------------------------------------------------------- rooms

#: No module is longer than this (a module over it does more than one job: split it by
#: moving a cohesive part out, not by deleting docstrings).
MAX_LINES = 450

#: Being split on another branch; the lead empties this set when the branches merge.
BEING_SPLIT: set[str] = set()


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        p.relative_to(ROOT.parent).as_posix(): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert {k: v for k, v in long.items() if k not in BEING_SPLIT} == {}
    stale = BEING_SPLIT - set(long)
    assert not stale, f"split now: remove from BEING_SPLIT: {sorted(stale)}"


def _private_imports(module: str, tree: ast.Module) -> list[str]:
    """``from <another ptestore module> import _name``, anywhere in ``module``. A private
    *module* (``from .. import _io``, ``from .storage._options import check_options``)
    is not a private name; a package's ``__init__`` may re-export its own modules'."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _resolve(module, node.level, node.module)
        if source not in MODULES:
            continue  # not ptestore's
        if module in PACKAGES and _within(source, module):
            continue  # a package re-exporting its own module's name
        for alias in node.names:
            name = alias.name
            private = name.startswith("_") and not name.startswith("__")
            if private and f"{source}.{name}" not in MODULES:
                found.append(f"{module} imports {source}.{name}")
    return found


#: Known, fixed on another branch (the lead empties it at merge).
PRIVATE_ALLOWED: set[str] = set()


def test_no_module_imports_another_modules_private_name() -> None:
    found = set()
    for module, path in MODULES.items():
        found.update(_private_imports(module, ast.parse(path.read_text(), str(path))))
    assert found - PRIVATE_ALLOWED == set()
    stale = PRIVATE_ALLOWED - found
    assert not stale, f"fixed now: remove from PRIVATE_ALLOWED: {sorted(stale)}"


def test_a_private_import_is_found() -> None:
    tree = ast.parse("from .output import _copies, planned_copies\nfrom .. import _io\n")
    assert _private_imports("ptestore.coordinator.digest", tree) == [
        "ptestore.coordinator.digest imports ptestore.coordinator.output._copies"
    ]
    own = ast.parse("from ._staging import _named\n")
    assert _private_imports("ptestore.writers", own) == []


#: The floors of the house, lowest first: a module may import its own floor and the ones
#: below, never one above (lazy imports, ``TYPE_CHECKING`` ones and parent packages
#: included: :func:`import_graph`). A module is on the floor of the longest prefix that
#: names it; ``=name`` names that one module only.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # the standard library's neighbours: what every floor may take
    (
        "base",
        (
            "ptestore.errors",
            "ptestore._oserror",
            "ptestore._version",
            "ptestore._align",
            "ptestore._io",
            "ptestore._libc",
            "ptestore._crc32",
            "ptestore._log",
            "ptestore._signals",
            "ptestore._background",
            "ptestore._dataclass",
            "ptestore._lazy",
            "ptestore._jsondepth",
            "ptestore._text",
            "ptestore._redact",
            "ptestore._args",
            "ptestore._names",
            "ptestore._retry",
            "ptestore.checksums",
            "=ptestore.storage",  # its __init__ imports nothing
            "ptestore.storage.types",
            "ptestore.storage._options",
            "ptestore.storage.base",
            "ptestore.storage._s3source",
        ),
    ),
    # the container model: parse, lay out, patch; no I/O beyond a DataLoader
    ("format", ("ptestore.format",)),
    # the loaders and the option routing; the journal's format and recovery
    (
        "storage",
        (
            "ptestore.storage",
            "ptestore.journal",
            "ptestore.journal_check",
            "ptestore.journal_binding",
            "ptestore.journal_read",
        ),
    ),
    ("writers", ("ptestore.writers",)),
    # the backend API and registry (read the model, never write)
    ("backends", ("ptestore.backends",)),
    ("provenance", ("ptestore.provenance",)),
    # the run, and the tools beside it that read or clean what runs leave
    ("coordinator", ("ptestore.coordinator", "ptestore.inspection", "ptestore.gc")),
    # XNNPACK's packed weights: made by the fleet's workers and on the device
    ("xnnpack", ("ptestore.xnnpack",)),
    ("fleet", ("ptestore.fleet",)),
    ("device", ("ptestore.device", "ptestore.verification", "ptestore.integrity")),
    # the front doors: the CLI, the pictures, the test kit, the package root (whose
    # lazy exports reach everything) and the deprecated import paths
    (
        "front",
        (
            "ptestore.cli",
            "ptestore.viz",
            "ptestore.testing",
            "=ptestore",
            "=ptestore.__main__",
            "=ptestore.loaders",
            "=ptestore.writers.gc",
        ),
    ),
]

#: Edges that break the order today, each fixed on another branch (emptied at merge).
LAYER_ALLOWED: set[tuple[str, str]] = set()

#: Old import paths: deprecated aliases that nothing inside ptestore may import.
DEPRECATED_ALIASES = {"ptestore.loaders", "ptestore.writers.gc"}


def floor_of(module: str) -> int:
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if prefix.startswith("="):
                if module == prefix[1:]:
                    return i
            elif _within(module, prefix) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is on no floor of FLOORS")
    return best[0]


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, t) for m, ts in graph.items() for t in ts if floor_of(t) > floor_of(m)}


def test_every_module_is_on_a_floor() -> None:
    for module in MODULES:
        floor_of(module)


def test_no_floor_imports_a_higher_one() -> None:
    found = _upward(import_graph())
    named = {(m, t, FLOORS[floor_of(m)][0], FLOORS[floor_of(t)][0]) for m, t in found}
    assert {x for x in named if x[:2] not in LAYER_ALLOWED} == set()
    stale = LAYER_ALLOWED - found
    assert not stale, f"fixed now: remove from LAYER_ALLOWED: {sorted(stale)}"


def test_an_upward_import_is_found_lazy_ones_included() -> None:
    graph = import_graph()
    graph["ptestore.format.layout"].add("ptestore.coordinator.output")
    assert ("ptestore.format.layout", "ptestore.coordinator.output") in _upward(graph)
    # the real lazy edges count: the pipeline's provenance stamp is imported in a
    # function, and sits on a lower floor (an allowed, downward edge)
    assert "ptestore.provenance.stamp" in graph["ptestore.coordinator.pipeline"]
    assert floor_of("ptestore.provenance.stamp") < floor_of("ptestore.coordinator.pipeline")
    assert floor_of("ptestore.storage.types") == 0 < floor_of("ptestore.storage.loaders")


def test_nothing_inside_imports_a_deprecated_alias() -> None:
    graph = import_graph()
    assert {m for m, ts in graph.items() if ts & DEPRECATED_ALIASES} == set()


def test_the_coordinator_docstring_names_every_module() -> None:
    doc = ast.get_docstring(ast.parse(MODULES["ptestore.coordinator"].read_text())) or ""
    modules = [m for m in MODULES if m.startswith("ptestore.coordinator.")]
    assert [m for m in modules if f":mod:`.{m.rsplit('.', 1)[1]}`" not in doc] == []
