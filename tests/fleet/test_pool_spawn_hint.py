"""A local pool that breaks before any pair started, run from a script: the pairs'
error says why that most often is (the workers are spawned and import the main module
again, so an unguarded script runs itself once per worker) and what to do. A real
unguarded script run in a process of its own, and the hint's two cases pinned on the
pool's rounds stood in for (a break needs a script: ``python -c`` code is not run
again by a spawned worker)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

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


def test_an_unguarded_script_fails_its_pairs_with_the_hint(tmp_path: Path) -> None:
    """The docs' example as a user first saves it, without the ``__main__`` guard: each
    spawned worker runs the script again, which starts a pool while bootstrapping and
    dies; every pair fails, naming the guard."""
    mlp = get_fixture("mlp_xnnpack").pte_path
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        'backends = ["passthrough"]\n'
        f'[[models]]\nname = "m"\nsource = "{mlp}"\n'
        '[devices.d]\nsoc = "s"\n'
    )
    script = tmp_path / "run_fleet.py"
    script.write_text(
        "from ptestore.fleet import load_job, plan_job, run_plan\n"
        f"result = run_plan(plan_job(load_job({str(job)!r})), workers=2)\n"
        "for p in result.pairs:\n"
        "    print('PAIR', p.status, p.error)\n"
    )
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=240
    )
    pairs = [line for line in run.stdout.splitlines() if line.startswith("PAIR ")]
    assert pairs, run.stdout + run.stderr
    assert all(line.startswith("PAIR failed ") and line.endswith(HINT) for line in pairs), pairs
    assert not (tmp_path / "out").exists()
