"""A local pool that breaks before any pair started, run from a script: the pairs'
error says why that most often is (the workers are spawned and import the main module
again, so an unguarded script runs itself once per worker) and what to do. The pool's
rounds are stood in for: the message is what is pinned, not a real break."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from ptestore.fleet import pool

DEATH = "BrokenProcessPool: A process in the process pool was terminated abruptly"
HINT = (
    " (run_plan starts its workers with spawn: a script must guard its entry point "
    "with `if __name__ == '__main__':`)"
)


class _Pair:
    def lost(self, error: str) -> str:
        return error


def _broken_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``run_pool`` over two pairs whose every pool breaks before any pair started."""

    def round_(items: list[Any], *_: object) -> tuple[list[Any], list[Any], str, bool]:
        return [], items, DEATH, False

    monkeypatch.setattr(pool, "_pool_round", round_)
    errors: list[str] = []
    todo: list[Any] = [(i, _Pair(), None) for i in range(2)]
    pool.run_pool(todo, 2, lambda _i, p, r: errors.append(r), lambda: False)
    return errors


def test_a_script_is_told_to_guard_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    script = types.ModuleType("__main__")
    script.__file__ = "/home/me/run_fleet.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    why = f"worker processes died {pool.POOL_IDLE_BREAKS} times before any pair started: "
    assert _broken_run(monkeypatch) == [why + DEATH + HINT] * 2


def test_no_hint_without_a_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interactive session, ``python -c`` or an embedding: no main file to guard."""
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    why = f"worker processes died {pool.POOL_IDLE_BREAKS} times before any pair started: "
    assert _broken_run(monkeypatch) == [why + DEATH] * 2
