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


TWO = REPO / "tests" / "fixtures" / "two_methods_xnnpack.pte"

STEPS = textwrap.dedent(
    """
    import json, os, shutil, sys
    import numpy as np
    from ptestore.xnnpack import load
    pte, cache, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    program = load(pte, cache=cache)
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    errors = []
    for step in steps:
        error = None
        if step == "release":  # as a fetch of the next version or an eviction does
            os.unlink(cache + ".json"); os.unlink(cache)
        elif step == "replace":  # the same bytes, another inode
            shutil.copy2(cache, cache + ".new"); os.replace(cache + ".new", cache)
        else:
            try:
                program.run(step, [x])
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        errors.append(error)
    print(json.dumps(errors))
    """
)


@pytest.fixture(scope="module")
def two_made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    return make_cache(TWO, directory=tmp_path_factory.mktemp("two"))


def run_steps(made: CacheFile, pte: Path, directory: Path, steps: list[str]) -> list[str | None]:
    for p in (made.path, made.record_path):
        shutil.copy2(p, directory / p.name)
    cache = directory / made.path.name
    out = subprocess.run(
        [sys.executable, "-c", STEPS, str(pte), str(cache), json.dumps(steps)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    errors: list[str | None] = json.loads(out.stdout.strip().splitlines()[-1])
    return errors


@pytest.mark.parametrize("then", ["release", "replace"])
def test_a_loaded_method_runs_on_after_its_file_is_released(
    two_made: CacheFile, tmp_path: Path, then: str
) -> None:
    """The file is checked when a method loads (its first run), not at every run: a method
    loaded holds the verified bytes; one loading after the file went is refused."""
    steps = ["forward", then, "forward", "forward", "forward_relu"]
    errors = run_steps(two_made, TWO, tmp_path, steps)
    assert errors[:4] == [None, None, None, None]
    assert errors[4] == (
        f"IntegrityError: {tmp_path / two_made.path.name}: removed, replaced or changed since "
        "load() verified it; not handed to the runtime (load it again)"
    )


RUNS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ptestore.xnnpack import load
    from ptestore.xnnpack.loader import _shim
    pte, cache, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    lib = _shim()
    with load(pte, cache=cache) as program:
        for _ in range(1000):  # the allocators' own growth first
            program.run("forward", [x])
        before = rss()
        for _ in range(n):
            program.run("forward", [x])
        runs = rss() - before
    path = cache.encode()
    before = rss()
    for _ in range(n):  # the same path configured again and again (a load per call)
        lib.ptestore_xnn_configure(path)
    lib.ptestore_xnn_configure(b"")
    configures = rss() - before
    print(json.dumps({
        "runs": runs, "configures": configures, "configs": lib.ptestore_xnn_configs(),
        "loads_with_options": lib.ptestore_xnn_count(1),
    }))
    """
)


def test_many_runs_and_configurations_keep_native_memory_bounded(
    made: CacheFile, tmp_path: Path
) -> None:
    """Each run configured the shim, which made a configuration (about 1.1 KiB) never
    freed: 20,000 runs grew 21 MiB. Now a run configures only while its method loads,
    and a path configured again reuses its configuration."""
    for p in (made.path, made.record_path):
        shutil.copy2(p, tmp_path / p.name)
    out = subprocess.run(
        [sys.executable, "-c", RUNS, str(MLP), str(tmp_path / made.path.name), "20000"],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loads_with_options"] == 1 and report["configs"] == 2  # /proc/self/fd/N, path
    assert report["runs"] < 4 << 20 and report["configures"] < 4 << 20, report


SHIM = textwrap.dedent(
    """
    import json, sys, threading
    import numpy as np
    from ptestore.xnnpack.loader import _configure, _shim
    from ptestore.xnnpack.native import bindings
    pte, cache = sys.argv[1], sys.argv[2]
    lib = _shim()
    try:
        _configure(lib, b"/" + b"x" * 300)
        too_long = None
    except Exception as exc:
        too_long = f"{type(exc).__name__}: {exc}"
    portable_lib = bindings()
    configured, finish = threading.Event(), threading.Event()
    def other_thread():  # a program of ptestore's about to load with its file
        lib.ptestore_xnn_configure(cache.encode())
        configured.set()
        finish.wait()
        lib.ptestore_xnn_configure(b"")
    t = threading.Thread(target=other_thread)
    t.start()
    configured.wait()
    import torch
    seen, added = lib.ptestore_xnn_count(0), lib.ptestore_xnn_count(1)
    module = portable_lib._load_for_executorch(pte)  # plain bindings, in this thread
    module.run_method("forward", [torch.zeros(2, 16)])
    finish.set()
    t.join()
    print(json.dumps({
        "too_long": too_long, "seen": lib.ptestore_xnn_count(0) - seen,
        "added": lib.ptestore_xnn_count(1) - added,
    }))
    """
)


def test_the_shim_configures_its_own_thread_and_refuses_a_path_too_long(
    made: CacheFile,
) -> None:
    """A path configured by one thread is never given to a load in another (plain
    bindings there got ptestore's file while a run was configured); a path the runtime's
    option cannot hold is an error, not a run without the file."""
    out = subprocess.run(
        [sys.executable, "-c", SHIM, str(MLP), str(made.path)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["too_long"] == (
        "ConfigurationError: /" + "x" * 300 + ": too long for the runtime's "
        "packed_cache_path option (301 bytes, at most 255)"
    )
    assert report["seen"] == 1 and report["added"] == 0


FAILED = textwrap.dedent(
    """
    import json, os, sys
    from ptestore.xnnpack import load
    pte, cache = sys.argv[1], sys.argv[2]
    try:
        load(pte, cache=cache)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    held = []
    for n in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:
            pass
    mine = {os.path.realpath(cache), os.path.realpath(pte)}
    print(json.dumps({"error": error, "held": sorted(h for h in held if h in mine)}))
    """
)


def test_a_load_that_fails_after_the_check_releases_what_it_held(
    made: CacheFile, tmp_path: Path
) -> None:
    """The native piece cannot be built (no compiler, an empty build cache) after the file
    was verified: nothing load() opened stays open."""
    for p in (made.path, made.record_path):
        shutil.copy2(p, tmp_path / p.name)
    (tmp_path / "empty").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", FAILED, str(MLP), str(tmp_path / made.path.name)],
        capture_output=True,
        text=True,
        env={**env(), "XDG_CACHE_HOME": str(tmp_path / "empty"), "CXX": "/nonexistent/c++"},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["error"] == (
        "ConfigurationError: ptestore.xnnpack builds a small native piece on first use and "
        "needs a C++17 compiler: '/nonexistent/c++' is not on PATH (install g++, e.g. "
        "`apt-get install g++`, or set CXX to one)"
    )
    assert report["held"] == []


def test_a_program_s_repr_names_its_files_methods_and_state(
    made: CacheFile, tmp_path: Path
) -> None:
    for p in (made.path, made.record_path):
        shutil.copy2(p, tmp_path / p.name)
    cache = tmp_path / made.path.name
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from ptestore.xnnpack import load
        program = load(sys.argv[1], cache=sys.argv[2])
        print(repr(program))
        program.run("forward", [np.zeros((2, 16), dtype=np.float32)])
        print(repr(program))
        program.close()
        print(repr(program))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(MLP), str(cache)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    head = f"<XnnpackProgram {MLP} cache={cache}"
    assert out.stdout.splitlines()[-3:] == [
        f"{head} methods=[]>",
        f"{head} methods=['forward']>",
        f"{head} closed>",
    ]
