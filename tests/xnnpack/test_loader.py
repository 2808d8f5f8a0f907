"""``load()``: the runtime gets the inode load() verified, never a file it did not.

The runtime opens the packed-weight file only when a method first runs. A file removed
or replaced between ``load()`` and that run was re-created by the runtime (an unchecked
0600 file under the verified name, no record); now the run refuses it and the directory
is left as it was. Each case runs in a fresh interpreter: ``load`` must come before the
bindings' extension is imported.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.xnnpack_probe import REPO, env

from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import CacheFile, make_cache

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

MLP = REPO / "tests" / "fixtures" / "mlp_xnnpack.pte"

SCRIPT = textwrap.dedent(
    """
    import json, os, shutil, sys
    import numpy as np
    from ptestore.xnnpack import load
    pte, cache, then = sys.argv[1], sys.argv[2], sys.argv[3]
    program = load(pte, cache=cache)
    if then == "remove":
        os.unlink(cache + ".json"); os.unlink(cache)
    elif then == "replace":  # the same bytes, another inode (as a second fetch leaves it)
        shutil.copy2(cache, cache + ".new"); os.replace(cache + ".new", cache)
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    if then == "close":  # after a run: the methods, then the descriptor, released
        program.run("forward", [x])
        program.close()
    try:
        program.run("forward", [x])
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    held = []
    for n in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:
            pass
    mine = os.path.realpath(cache)
    print(json.dumps({"error": error, "held": any(h.startswith(mine) for h in held)}))
    """
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    return make_cache(MLP, directory=tmp_path_factory.mktemp("made"))


def run_after(made: CacheFile, directory: Path, then: str) -> tuple[str | None, str]:
    for p in (made.path, made.record_path):
        shutil.copy2(p, directory / p.name)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(MLP), str(directory / made.path.name), then],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["held"] is (then != "close")  # the verified file held until close()
    error: str | None = report["error"]
    return error, out.stderr


def test_the_runtime_loads_the_verified_inode(made: CacheFile, tmp_path: Path) -> None:
    error, stderr = run_after(made, tmp_path, "nothing")
    assert error is None
    assert "Loaded packed weight cache: /proc/self/fd/" in stderr and "(2 entries)" in stderr
    assert "Opened packed weight file for writing" not in stderr


@pytest.mark.parametrize("then", ["remove", "replace"])
def test_a_file_removed_or_replaced_after_load_is_refused_not_recreated(
    made: CacheFile, tmp_path: Path, then: str
) -> None:
    error, stderr = run_after(made, tmp_path, then)
    path = tmp_path / made.path.name
    assert error == (
        f"IntegrityError: {path}: removed, replaced or changed since load() verified it; "
        "not handed to the runtime (load it again)"
    )
    assert "Opened packed weight file for writing" not in stderr
    if then == "remove":  # the runtime wrote nothing in its place
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    else:
        assert path.stat().st_mode & 0o777 == 0o444 and path.stat().st_size == made.size


def test_a_closed_program_releases_the_file_and_does_not_run(
    made: CacheFile, tmp_path: Path
) -> None:
    error, _ = run_after(made, tmp_path, "close")
    assert error == "ConfigurationError: the program was closed"
