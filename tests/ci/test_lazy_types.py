"""A package's lazy names are typed: every name ``__getattr__`` imports on first use
(``ptestore``'s ``_LAZY``, ``ptestore.testing``'s ``_EXPORTS``) is also imported under
``if TYPE_CHECKING:`` from the module the table names. Without it a type checker sees
``__getattr__``'s ``Any``: ``class C(BackendContract)`` fails ``mypy --strict`` ("Class
cannot subclass BackendContract (has type Any)"). Checked statically (:mod:`ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ptestore

ROOT = Path(ptestore.__file__).parent

#: Each package with lazy names, and the name of its table (name -> relative module).
TABLES = {"__init__.py": "_LAZY", "testing/__init__.py": "_EXPORTS"}


def _table(tree: ast.Module, table: str) -> dict[str, str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == table for t in node.targets
        ):
            return ast.literal_eval(node.value)  # type: ignore[no-any-return]
    raise AssertionError(f"no {table} table")


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """Name -> ``.module`` of the relative imports under a top-level
    ``if TYPE_CHECKING:``."""
    seen: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and inner.level == 1:
                    for alias in inner.names:
                        seen[alias.asname or alias.name] = f".{inner.module}"
    return seen


def missing_types(source: str, table: str) -> list[str]:
    """The lazy names of ``source`` not imported, from the same module, for a type
    checker."""
    tree = ast.parse(source)
    typed = _type_checking_imports(tree)
    return [
        f"{name} (from {module})"
        for name, module in _table(tree, table).items()
        if typed.get(name) != module
    ]


@pytest.mark.parametrize(("init", "table"), TABLES.items())
def test_every_lazy_name_is_typed(init: str, table: str) -> None:
    assert missing_types((ROOT / init).read_text(), table) == []


def test_a_name_left_out_is_found() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .a import A\n"
        "    from .c import B\n"
        "_EXPORTS = {'A': '.a', 'B': '.b', 'C': '.c'}\n"
    )
    assert missing_types(source, "_EXPORTS") == ["B (from .b)", "C (from .c)"]
