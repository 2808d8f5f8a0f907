"""A package's ``__init__`` imports none of its own submodules (its public names are
imported on first use, :func:`ptestore._lazy.lazy_names`): a thread importing the
package while another imports one of its submodules first (an application calling
``ptestore.verify`` and ``ptestore.ensure`` from two threads at once, before either
ran) then cannot meet the other on the two modules' import locks, which CPython reports
as a ``_DeadlockError`` in one of them. Pinned statically for every package, and by the
interleaving itself in a fresh interpreter for each: the submodule's import is held
(a trace function) right where it imports the package, until the other thread is inside
the package's ``__init__``. And no public name of a package is also the name of one of
its submodules unless it is that submodule (importing the submodule rebinds the
package's name to it)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import ptestore

ROOT = Path(ptestore.__file__).parent
#: The command line runs in one thread; the root package is what an application imports.
EXEMPT = {ROOT / "__init__.py", ROOT / "cli" / "__init__.py"}
INITS = sorted(
    p for p in ROOT.rglob("__init__.py") if p not in EXEMPT and "__pycache__" not in p.parts
)


def _eager_own_imports(init: Path) -> list[str]:
    """The top-level imports of ``init``'s own submodules, outside ``if TYPE_CHECKING``."""
    found = []
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.append(f"line {node.lineno}: from .{node.module or ''} import ...")
        if isinstance(node, ast.Import):
            pkg = ".".join(init.relative_to(ROOT.parent).parent.parts)
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith(pkg + ".")
            ]
    return found


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_a_package_imports_none_of_its_submodules_up_front(init: Path) -> None:
    assert _eager_own_imports(init) == []


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_public_name_is_also_a_submodule(init: Path) -> None:
    package = ".".join(init.relative_to(ROOT.parent).parent.parts)
    module = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules([str(init.parent)])}
    for name in sorted(set(getattr(module, "__all__", ())) & submodules):
        # only a name that is the submodule itself (``ptestore.testing.moto``)
        assert getattr(module, name) is importlib.import_module(f"{package}.{name}"), name


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_every_public_name_resolves(init: Path) -> None:
    package = ".".join(init.relative_to(ROOT.parent).parent.parts)
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", ()):
        assert getattr(module, name) is not None, name


#: In a fresh interpreter: thread A imports SUB; a trace function holds it where it
#: imports PKG (SUB's lock held) until thread B, importing PKG, runs PKG's ``__init__``.
INTERLEAVE = """\
import sys, threading
import ptestore

PKG, SUB = sys.argv[1], sys.argv[2]
in_init, a_held, errors = threading.Event(), threading.Event(), []


def hold_a(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "_find_and_load":
        if frame.f_locals.get("name") == PKG:
            a_held.set()
            in_init.wait(60)
    return None


def see_b(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "<module>":
        if frame.f_globals.get("__name__") == PKG:
            in_init.set()
    return None


def run(name, tracer, module):
    sys.settrace(tracer)
    try:
        __import__(module)
    except BaseException as exc:
        errors.append(f"{name}: {exc!r}")
    finally:
        sys.settrace(None)


a = threading.Thread(target=run, args=("A", hold_a, SUB))
a.start()
if not a_held.wait(60):
    sys.exit(f"importing {SUB} never imported {PKG}")
b = threading.Thread(target=run, args=("B", see_b, PKG))
b.start()
a.join()
b.join()
print(errors or "ok")
"""

PAIRS = [
    ("ptestore.format", "ptestore.format.model"),
    ("ptestore.device", "ptestore.device.lock"),
    ("ptestore.fleet", "ptestore.fleet.job"),
    ("ptestore.backends", "ptestore.backends.api"),
    ("ptestore.writers", "ptestore.writers.base"),
    ("ptestore._retry", "ptestore._retry.policy"),
    ("ptestore.viz", "ptestore.viz.matrix"),
    ("ptestore.writers.s3", "ptestore.writers.s3.config"),
]


@pytest.mark.parametrize(("package", "submodule"), PAIRS)
def test_first_imports_from_two_threads_do_not_deadlock(package: str, submodule: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", INTERLEAVE, package, submodule],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT.parent), "PATH": "/usr/bin:/bin"},
    )
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), run.stderr


def test_what_the_public_functions_return_is_public() -> None:
    """A user annotating ``ptestore.fetch(...)``'s result imports its type from
    ``ptestore`` (``Choice`` and ``FetchResult`` were reachable only by their modules)."""
    import inspect
    import re

    import ptestore

    missing = []
    for name in ptestore.__all__:
        fn = getattr(ptestore, name)
        if not inspect.isfunction(fn):
            continue
        returned = str(fn.__annotations__.get("return", ""))
        module = importlib.import_module(fn.__module__)
        for ident in re.findall(r"[A-Za-z_]\w*", returned):
            cls = getattr(module, ident, None)
            public = ident in ptestore.__all__
            if isinstance(cls, type) and cls.__module__.startswith("ptestore") and not public:
                missing.append(f"{name} -> {ident}")
    assert missing == []
