"""Cost proportional to what changed: the side-by-side harness (docs/benchmarks.md).

    python benchmarks/run.py --sizes 256M,1G,4G --out docs/benchmarks-data.json
    python benchmarks/run.py --render docs/benchmarks-data.json     # the Markdown tables

For every size, on every storage (``ext4``: the work directory; ``xfs``: a loop-mounted
XFS with ``reflink=1``, needs root and xfsprogs), in the same run on the same file, each
case runs ``--runs`` times, interleaved (run 1 of every case, then run 2, ...), each in a
fresh process: ``cp --reflink=never`` + ``sync FILE`` (the durable copy), on XFS also
``cp --reflink=always`` + ``sync``, ptestore passthrough, one 16 MiB weight replaced,
10% of the bytes replaced, ``bare``: ``python -c pass`` (a bare interpreter, what the
"over bare" figures subtract round by round), ``cli``: the command line's passthrough
(``python -m ptestore specialize SRC DST --backend passthrough --quiet
--no-provenance``: the same work as ``passthrough``, as a whole process from a bare
interpreter; the other ptestore cases run in ``_child.py``, which imports numpy in every
mode), ``cli_provenance``: the same with the command line's default provenance trailer
(which reads and hashes the whole source: SHA-256), and ExecuTorch's own Python round trip
(``deserialize_pte_binary`` then ``serialize_pte_binary``; up to ``--et-max``).
``--cases`` keeps only the cases named (the peers always run: every ratio needs them).

Figures per run: wall time of the whole process (interpreter start-up included) and
inside it (``inner``), peak RSS of the whole process (``wait4``), bytes read from and
written to storage (``ru_inblock``/``ru_oublock``: the kernel's per-process I/O
accounting, so in-kernel copies count and shared extents do not), and the new disk
space the output takes (XFS: the file system's free space before and after, settled;
ext4: the output's allocated blocks). Ratios are taken pair by pair (run i of a case
against run i of ``cp_sync``), then the median.

Programs: 256 MiB and 1 GiB are real XNNPACK exports (``make_large_pte.py``: 16 or 64
x Linear(2048, 2048), 16 MiB weights); 4 GiB is synthesized from the real 1 GiB export
(``make_large_pte.py --grow-from``: 16 weights of 16 MiB kept, 48 grown to 80 MiB).
The 256 MiB one is run in the real runtime.

Storage hook: :data:`STORAGES` maps a name to a factory ``(work_dir) -> context manager
of a Storage``; another storage (S3 on moto) adds an entry with its own ``cp`` peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
MIB = 1 << 20
LAYERS = {"256M": 16, "1G": 64}


@dataclass
class Storage:
    """Where one series runs: a directory, how to copy a file durably there, and how
    to count the new space an output takes."""

    name: str
    directory: Path
    #: case name -> shell command template with {src} and {dst} (the peers)
    peers: dict[str, str]
    new_space: Callable[[Path, int], int]
    settle: Callable[[], int] = lambda: 0
    notes: list[str] = field(default_factory=list)


def _blocks_space(path: Path, before: int) -> int:
    return path.stat().st_blocks * 512


@contextlib.contextmanager
def ext4_storage(work: Path) -> Iterator[Storage]:
    d = work / "ext4"
    d.mkdir(parents=True, exist_ok=True)
    yield Storage(
        "ext4",
        d,
        {"cp_sync": "cp --reflink=never {src} {dst} && sync {dst}"},
        _blocks_space,
    )


def _free(path: Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _settled_free(path: Path) -> int:
    """XFS frees unlinked files in the background: wait for three equal figures."""
    seen = [_free(path)]
    deadline = time.monotonic() + 30
    while (len(seen) < 3 or len(set(seen[-3:])) > 1) and time.monotonic() < deadline:
        time.sleep(0.25)
        seen.append(_free(path))
    return seen[-1]


@contextlib.contextmanager
def xfs_storage(work: Path, size: str = "24G") -> Iterator[Storage]:
    image, mnt = work / "xfs.img", work / "xfs-mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    image.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield Storage(
            "xfs",
            mnt,
            {
                "cp_sync": "cp --reflink=never {src} {dst} && sync {dst}",
                "cp_reflink": "cp --reflink=always {src} {dst} && sync {dst}",
            },
            lambda path, before: before - _settled_free(mnt),
            settle=lambda: _settled_free(mnt),
        )
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        image.unlink(missing_ok=True)


#: name -> factory(work dir) -> context manager of a Storage (the S3 hook goes here)
STORAGES: dict[str, Callable[[Path], contextlib.AbstractContextManager[Storage]]] = {
    "ext4": ext4_storage,
    "xfs": xfs_storage,
}


def measure_rusage(cmd: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}): {err.decode()[-2000:]}")
    line = out.decode().strip().splitlines()[-1] if out.strip() else "{}"
    data = json.loads(line) if line.startswith("{") else {}
    return {
        "wall_s": wall,
        "inner_s": data.get("inner_s"),
        "maxrss_mib": ru.ru_maxrss / 1024,
        "read_mib": ru.ru_inblock * 512 / MIB,
        "written_mib": ru.ru_oublock * 512 / MIB,
        "file": data.get("file"),
    }


def make_programs(work: Path, sizes: list[str]) -> dict[str, dict[str, Any]]:
    progs: dict[str, dict[str, Any]] = {}
    for size in sizes:
        path = work / f"model-{size}.pte"
        info: dict[str, Any] = {"path": str(path)}
        if not path.exists():
            if size in LAYERS:
                cmd = [PY, str(HERE / "make_large_pte.py"), str(path)]
                cmd += ["--layers", str(LAYERS[size]), "--dim", "2048"]
            elif size == "4G":
                base = work / "model-1G.pte"
                if not base.exists():
                    make_programs(work, ["1G"])
                cmd = [PY, str(HERE / "make_large_pte.py"), str(path), "--grow-from", str(base)]
                cmd += ["--keep", "16", "--factor", "5"]
            else:
                raise SystemExit(f"--sizes: unknown size {size!r} (256M, 1G, 4G)")
            r = measure_rusage(cmd)
            info["made_s"], info["made_maxrss_mib"] = r["wall_s"], r["maxrss_mib"]
        info["bytes"] = path.stat().st_size
        grown = "grown from the real 1 GiB export (48 of 64 weights x5)"
        info["how"] = "real export" if size in LAYERS else grown
        progs[size] = info
    return progs


def check_in_runtime(path: str) -> str:
    code = (
        "import sys, torch\n"
        "from executorch.runtime import Runtime\n"
        "m = Runtime.get().load_program(sys.argv[1]).load_method('forward')\n"
        "out = m.execute([torch.ones(1, 2048)])[0]\n"
        "assert tuple(out.shape) == (1, 2048) and bool(torch.isfinite(out).all()), out\n"
        "print('ok', float(out.abs().sum()))\n"
    )
    r = subprocess.run([PY, "-c", code, path], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


#: The command line's passthrough, a whole process (the ``cli_provenance`` case; ``cli``
#: adds ``--no-provenance``).
CLI_PASSTHROUGH = [PY, "-m", "ptestore", "specialize", "{src}", "{dst}"]
CLI_PASSTHROUGH += ["--backend", "passthrough", "--quiet"]


def _cases(
    storage: Storage, size: str, et_max: str, et_on: list[str], only: list[str] | None = None
) -> list[str]:
    cases = [*storage.peers, "passthrough", "one", "tenpct", "bare", "cli", "cli_provenance"]
    if _mib(size) <= _mib(et_max) and storage.name in et_on:
        cases.append("et")
    return [c for c in cases if only is None or c in storage.peers or c in only]


def _mib(size: str) -> int:
    return int(size[:-1]) * (1024 if size.endswith("G") else 1)


def run_series(
    storage: Storage,
    src: Path,
    size: str,
    runs: int,
    et_max: str,
    et_on: list[str],
    only: list[str] | None = None,
) -> dict[str, Any]:
    local = storage.directory / src.name
    if not local.exists():
        shutil.copyfile(src, local)
    subprocess.run(["cat", str(local)], stdout=subprocess.DEVNULL, check=True)  # warm cache
    cases = _cases(storage, size, et_max, et_on, only)
    load = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(runs):
        for case in cases:
            dst = storage.directory / f"out-{case}.pte"
            dst.unlink(missing_ok=True)
            before = storage.settle()
            if case in storage.peers:
                shell = storage.peers[case].format(src=local, dst=dst)
                r = measure_rusage(["sh", "-c", shell])
            elif case == "bare":  # the interpreter alone: what "over bare" subtracts
                r = measure_rusage([PY, "-c", "pass"])
            elif case in ("cli", "cli_provenance"):
                argv = [a.format(src=local, dst=dst) for a in CLI_PASSTHROUGH]
                r = measure_rusage(argv + (["--no-provenance"] if case == "cli" else []))
            else:
                r = measure_rusage([PY, str(HERE / "_child.py"), case, str(local), str(dst)])
            if case != "bare":  # writes nothing
                r["new_space_mib"] = storage.new_space(dst, before) / MIB
            results[case].append(r)
            dst.unlink(missing_ok=True)
    local.unlink()
    storage.settle()
    return {
        "cases": results,
        "summary": summarize(results),
        "loadavg": [load, os.getloadavg()],
    }


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = results.get("cp_sync", [])
    for case, runs in results.items():
        s: dict[str, Any] = {"runs": len(runs)}
        for k in ("wall_s", "inner_s", "maxrss_mib", "read_mib", "written_mib", "new_space_mib"):
            vals = [r[k] for r in runs if r.get(k) is not None]
            if vals:
                s[k] = statistics.median(vals)
                if k == "wall_s":
                    s["wall_min_s"] = min(vals)
        if base and case != "cp_sync":
            # minimum against minimum: other load only ever adds time
            s["wall_min_vs_cp_sync_min"] = min(r["wall_s"] for r in runs) / min(
                b["wall_s"] for b in base
            )
            s["wall_vs_cp_sync"] = statistics.median(
                r["wall_s"] / b["wall_s"] for r, b in zip(runs, base, strict=True)
            )
            bare = results.get("bare")
            if bare and case.startswith("cli"):
                # the command's own cost: its wall time less a bare interpreter's of the
                # same round, against the durable copy of that round
                s["over_bare_vs_cp_sync"] = statistics.median(
                    (r["wall_s"] - i["wall_s"]) / b["wall_s"]
                    for r, i, b in zip(runs, bare, base, strict=True)
                )
                s["over_bare_s"] = statistics.median(
                    r["wall_s"] - i["wall_s"] for r, i in zip(runs, bare, strict=True)
                )
            if runs[0].get("inner_s") is not None:
                s["inner_vs_cp_sync"] = statistics.median(
                    r["inner_s"] / b["wall_s"] for r, b in zip(runs, base, strict=True)
                )
        file = runs[-1].get("file")
        if file:
            s["report"] = {
                k: file[k]
                for k in ("bytes_replaced", "bytes_cloned", "clone_padding", "clone_block_size")
            }
        out[case] = s
    return out


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "uname": " ".join(platform.uname()),
        "cpus": os.cpu_count(),
        "mem_gib": round(int(mem) / (1 << 20), 1),
        "python": platform.python_version(),
        "commit": commit,
        "cp": subprocess.run(
            ["cp", "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="256M,1G")
    ap.add_argument("--storages", default="ext4,xfs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default="/tmp/ptestore-bench")
    ap.add_argument("--et-max", default="1G", help="largest size for ExecuTorch's round trip")
    ap.add_argument(
        "--et-storages",
        default="ext4",
        help="storages the round trip runs on (it is CPU-bound: one is enough)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--cases",
        default=None,
        help="comma-separated cases to run besides the peers (default: all)",
    )
    ap.add_argument(
        "--merge",
        metavar="JSON",
        help="add this run's programs and series to an earlier result (kept otherwise)",
    )
    ap.add_argument("--render", metavar="JSON", help="print the Markdown tables of a result")
    args = ap.parse_args()
    if args.render:
        from _render import render

        print(render(json.loads(Path(args.render).read_text())))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = args.sizes.split(",")
    result: dict[str, Any] = {"machine": machine(), "loadavg_start": os.getloadavg()}
    progs = make_programs(work, sizes)
    result["programs"] = progs
    if "256M" in progs:
        progs["256M"]["runtime_check"] = check_in_runtime(progs["256M"]["path"])
    idle = [measure_rusage([PY, str(HERE / "_child.py"), "idle", "-", "-"]) for _ in range(3)]
    result["idle_maxrss_mib"] = statistics.median(r["maxrss_mib"] for r in idle)
    result["idle_wall_s"] = statistics.median(r["wall_s"] for r in idle)
    series: dict[str, Any] = {}
    for name in args.storages.split(","):
        with STORAGES[name](work) as storage:
            for size in sizes:
                print(f"{name} {size} ...", file=sys.stderr, flush=True)
                series[f"{name}/{size}"] = run_series(
                    storage,
                    Path(progs[size]["path"]),
                    size,
                    args.runs,
                    args.et_max,
                    args.et_storages.split(","),
                    None if args.cases is None else args.cases.split(","),
                )
    result["series"] = series
    result["loadavg_end"] = os.getloadavg()
    if args.merge:
        earlier = json.loads(Path(args.merge).read_text())
        earlier["programs"].update(result["programs"])
        earlier["series"].update(result["series"])
        earlier.setdefault("merged_runs", []).append(
            {k: result[k] for k in ("machine", "loadavg_start", "loadavg_end", "idle_maxrss_mib")}
        )
        result = earlier
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    from _render import render

    print(render(result))


if __name__ == "__main__":
    main()
