"""Benchmark: what the default provenance trailer costs with chunk digests (issue 28
part 1), whole ``ptestore specialize`` processes against ``cp`` + ``sync``.

    python benchmarks/bench_digests.py --work /tmp/bench-digests --sizes-mib 16,336,336,336 \
        --runs 3 --xfs

The program is made by ptestore from the real XNNPACK fixture ``mlp_xnnpack``
(``tests/support/large.py``: its four named values made ``--sizes-mib`` of seeded
random bytes, in key order; the real metadata, keys and delegate). By default 16, 336,
336 and 336 MiB: a 1 GiB program whose first value, the one replaced, is 16 MiB (the
issue's "one 16 MiB weight"). Two copies of it are kept: one
*never seen* (no trailer: ``provenance=False``) and one *known* (a pass-through with
the default trailer, so its record names its chunk digests). Cases, each a fresh
``python -m ptestore specialize`` process with the defaults (provenance on), run
``--runs`` times interleaved (run 1 of every case, then run 2, ...), each ratio taken
pair by pair against the ``cp --reflink=never`` + ``sync FILE`` of the same round:

- ``passthrough:never`` / ``passthrough:known``: ``specialize SRC DST --backend
  passthrough`` (allowed unchanged);
- ``inplace:never`` / ``inplace:known``: a fresh copy (made before the timer starts)
  specialized in place, one value replaced by its bytes reversed (same size, so it is
  written over its segment): ``--in-place --backend bench_digests_backend:Reverse``.

Every case starts from a quiet disk with its destination absent (removed, then
``sync``, before the timer starts): on a file system mounted with ``discard`` (this
machine's root) replacing a 1 GiB file frees it synchronously (``rm``: 0.8 s), and
the discards and writeback a case leaves behind slowed the next one's writes
(a pass-through's copy took 0.8 s or 2.3 s depending on what ran before it). A new
file is what a first run writes; the cost of replacing one is the same for ``cp``
(truncating) and ptestore (renaming over it), and is left out of both.

On ext4 every case is also compared with ``cp`` + ``sync`` over an existing copy
(``cp_sync_replacing``): in place ends with the file replaced, which a copy to a new
file then renamed over it reaches only by freeing the old one too.

``--xfs`` also runs the pass-through, the same one-value replacement to a new file
(``replace1``: the other segments are reflink clones) and a copy ``cp --reflink=always``
+ ``sync`` on a loop-mounted XFS with reflink (root and xfsprogs,
``tests/support/xfs.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable

_BACKEND = '''
from ptestore.backends import BackendData, BackendInterface


class Reverse(BackendInterface):
    """Replaces the first named value by its bytes reversed (same size): one copy and
    an in-place reversal (``bytearray.reverse``, 6 ms for 16 MiB; the per-byte slice
    ``bytes(...)[::-1]`` used up to stop 49 took 18 ms of the same work)."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context, output):
        named = context.get_named_data_map()
        key = sorted(named)[0]
        value = bytearray(named.get_data(key))
        value.reverse()
        output.write_named_data(key, BackendData(value))
'''


def _env(work: Path, editable: bool) -> tuple[str, dict[str, str]]:
    """The Python the cases run and its environment: by default ptestore as a user has
    it (:func:`_installed`); with ``editable``, this tree first on the path (what the
    series up to the one of commit a21e7c3 measured: this environment's editable-install finder,
    with ``pathlib`` and ``urllib``, costs every process 10-15 ms a user's does not
    pay). Either way the backend module's directory is on the path and its bytecode is
    compiled and used (a ``PYTHONDONTWRITEBYTECODE`` set in the caller's environment
    made every run compile ptestore's modules: 0.18 s)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if editable:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(work)])
        subprocess.run(
            [PY, "-m", "compileall", "-q", str(ROOT / "ptestore"), str(work)], check=True, env=env
        )
        return PY, env
    env["PYTHONPATH"] = str(work)
    subprocess.run([PY, "-m", "compileall", "-q", str(work)], check=True, env=env)
    return str(_installed(work)), env


def _installed(work: Path) -> Path:
    """The Python of a virtual environment under ``work`` holding ptestore as ``pip
    install`` leaves it: a wheel built from this tree, installed with its bytecode
    compiled, no editable-install finder. Its dependencies are this environment's (its
    site-packages named by a path line in a ``.pth``: added to ``sys.path``, its own
    ``.pth`` files not run)."""
    import sysconfig

    venv, wheels = work / "venv", work / "wheel"
    for old in (venv, wheels):
        shutil.rmtree(old, ignore_errors=True)
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "bench_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [PY, "-m", "pip", "-q"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)]
    subprocess.run([*pip, *build], check=True, stdout=subprocess.DEVNULL)
    wheel = next(wheels.glob("ptestore-*.whl"))
    install = ["install", "--no-deps", "--target", site, str(wheel)]
    subprocess.run([*pip, *install], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(py), "-m", "compileall", "-q", f"{site}/ptestore"], check=True)
    return py


def _quiet(*absent: Path) -> None:
    """Before a timer starts: ``absent`` removed and everything written out."""
    for path in absent:
        path.unlink(missing_ok=True)
    os.sync()


def _timed(cmd: list[str], env: dict[str, str], cwd: Path, dst: Path | None = None) -> float:
    """Seconds of ``cmd`` run in ``cwd``: a directory without a ``ptestore`` package, since
    ``python -m`` puts the current directory first on the path (run from this tree's root,
    every case imported the tree, not the environment's ptestore)."""
    _quiet(*([dst] if dst is not None else []))
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=cwd)
    return time.perf_counter() - t


def _cp_sync(
    src: Path, dst: Path, reflink: str, env: dict[str, str], replace: bool = False
) -> float:
    """``cp`` + ``sync`` of ``src`` to ``dst``: a new file, or (``replace``) over a copy
    of it made before the timer starts (what ``cp M M.new; sync; mv M.new M``, the
    alternative to in place, also pays: the old file freed)."""
    if replace:
        if not dst.exists():
            shutil.copyfile(src, dst)
        _quiet()
    else:
        _quiet(dst)
    t = time.perf_counter()
    subprocess.run(["cp", f"--reflink={reflink}", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=True)
    return time.perf_counter() - t


def _make(work: Path, sizes_mib: list[int]) -> tuple[Path, Path]:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from support.large import inflated

    import ptestore

    tag = "-".join(map(str, sizes_mib))
    never, known = work / f"never-{tag}.pte", work / f"known-{tag}.pte"
    inflated(never, [n << 20 for n in sizes_mib])
    if not known.exists():
        ptestore.specialize(never, known, allow_unchanged=True)
    (work / "bench_digests_backend.py").write_text(_BACKEND)
    return never, known


def _cases(
    store: Path, never: Path, known: Path, py: str, env: dict[str, str], xfs: bool
) -> dict[str, object]:
    """name -> a callable of no argument returning seconds."""
    spec = [py, "-m", "ptestore", "specialize", "--quiet"]
    out = store / "out.pte"
    cases: dict[str, object] = {
        "cp_sync": lambda: _cp_sync(known, store / "cp.pte", "never", env),
    }
    if not xfs:
        cases["cp_sync_replacing"] = lambda: _cp_sync(
            known, store / "cpr.pte", "never", env, replace=True
        )
    if xfs:
        cases["cp_reflink_sync"] = lambda: _cp_sync(known, store / "cpr.pte", "always", env)
    for label, src in (("never", never), ("known", known)):
        cases[f"passthrough:{label}"] = lambda src=src: _timed(
            [*spec, str(src), str(out), "--backend", "passthrough", "--allow-unchanged"],
            env,
            store,
            out,
        )
        if xfs:
            cases[f"replace1:{label}"] = lambda src=src: _timed(
                [*spec, str(src), str(out), "--backend", "bench_digests_backend:Reverse"],
                env,
                store,
                out,
            )
        else:

            def inplace(src: Path = src) -> float:
                target = store / "inplace.pte"
                shutil.copyfile(src, target)
                os.sync()
                return _timed(
                    [
                        *spec,
                        str(target),
                        str(target),
                        "--in-place",
                        "--backend",
                        "bench_digests_backend:Reverse",
                    ],
                    env,
                    store,
                )

            cases[f"inplace:{label}"] = inplace
    return cases


def _series(cases: dict[str, object], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            times[name].append(fn())  # type: ignore[operator]
    return times


def _report(title: str, times: dict[str, list[float]]) -> dict[str, object]:
    def ratio(ts: list[float], base: list[float]) -> float:
        return statistics.median(t / b for t, b in zip(ts, base, strict=True))

    rows = {}
    replacing = times.get("cp_sync_replacing")
    print(f"\n{title}: median s, median x cp+sync to a new file (and over one), pair by pair")
    for name, ts in times.items():
        row = {"seconds": ts, "median": statistics.median(ts)}
        row["x_cp_sync"] = ratio(ts, times["cp_sync"])
        line = f"  {name:24s} {statistics.median(ts):7.2f} s  {row['x_cp_sync']:6.2f}x"
        if replacing is not None:
            row["x_cp_sync_replacing"] = ratio(ts, replacing)
            line += f"  {row['x_cp_sync_replacing']:6.2f}x"
        rows[name] = row
        print(line)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/bench-digests")
    ap.add_argument(
        "--sizes-mib",
        default="16,336,336,336",
        help="the four named values' sizes in MiB, in key order (the first is replaced)",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--xfs", action="store_true", help="also on a loop-mounted XFS")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument(
        "--editable",
        action="store_true",
        help="run this tree on PYTHONPATH in this environment (its editable-install finder "
        "included), not a wheel of it installed in a virtual environment of its own",
    )
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    never, known = _make(work, [int(n) for n in args.sizes_mib.split(",")])
    py, env = _env(work, args.editable)
    result: dict[str, object] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(dir=work) as d:
        result["ext4"] = _report(
            "ext4", _series(_cases(Path(d), never, known, py, env, False), args.runs)
        )
    if args.xfs:
        from support.xfs import xfs_reflink_mount

        with xfs_reflink_mount("6G") as m:
            xn, xk = m.path / "never.pte", m.path / "known.pte"
            shutil.copyfile(never, xn)
            shutil.copyfile(known, xk)
            result["xfs"] = _report(
                "xfs", _series(_cases(m.path, xn, xk, py, env, True), args.runs)
            )
    result["load_after"] = os.getloadavg()
    print(f"\nload average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
