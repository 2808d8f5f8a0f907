"""Run programs in the REAL ExecuTorch runtime, in a child process.

Programs under test may crash the runtime (an XNNPACK program loaded without its .ptd is a
SIGSEGV in 1.4.1), and importing ExecuTorch costs ~3 s, so jobs are batched: one child process
runs a whole batch sequentially.  If the child dies (signal, abort, timeout), the job that was
running is reported as crashed and the remaining jobs run in a fresh child, so every crash is
attributed to exactly the job that caused it.

Loading:
- no .ptd: ``executorch.runtime.Runtime.get().load_program(...)`` (path -> mmap loader,
  bytes -> buffer loader), then ``load_method(name).execute(inputs)``;
- with a .ptd: ``executorch.extension.pybindings.portable_lib._load_for_executorch(pte_path,
  data_path=ptd_path)`` or ``_load_for_executorch_from_buffer(pte_bytes, ptd_bytes)`` (both
  buffers are kept referenced while the module lives), then ``run_method(name, inputs)``.
Verification defaults to InternalConsistency (the pybindings' default) in both cases.

The parent side needs only numpy; the child is this file run as a script with a Python that
has torch + executorch (``sys.executable`` unless ``PTESTORE_ET_PYTHON`` is set).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

LoadMode = Literal["path", "bytes"]
VerificationName = Literal["internal", "minimal"]
Source = str | os.PathLike[str] | bytes | bytearray | memoryview

_JOB_MARK = "=== ptestore-et-job "
DEFAULT_TIMEOUT = 600.0


@dataclass
class Job:
    """One method execution: load ``pte`` (+ optional ``ptd``), run ``method`` on ``inputs``."""

    pte: Source
    method: str = "forward"
    inputs: Sequence[np.ndarray] = ()
    ptd: Source | None = None
    load_mode: LoadMode = "path"
    verification: VerificationName = "internal"
    label: str = ""


@dataclass
class Result:
    """Outcome of one Job.  Exactly one of: ``outputs`` set (ok), ``error`` set (a Python
    exception in the child, e.g. ``RuntimeError: Failed to load program, error: 0x23``), or
    ``crashed`` (the child died while running this job; ``returncode`` is e.g. -11)."""

    index: int
    label: str
    outputs: list[np.ndarray] | None = None
    error: str | None = None
    crashed: bool = False
    returncode: int | None = None
    log: str = ""  # what the runtime wrote to stderr while running this job
    method_names: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outputs is not None

    def describe(self) -> str:
        if self.ok:
            return f"job {self.index} ({self.label}): ok"
        if self.crashed:
            return (
                f"job {self.index} ({self.label}): child crashed, returncode {self.returncode}; "
                f"log tail: {self.log[-2000:]}"
            )
        return f"job {self.index} ({self.label}): {self.error}; log tail: {self.log[-2000:]}"


def _source_payload(src: Source | None) -> tuple[str, Any] | None:
    if src is None:
        return None
    if isinstance(src, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(src))
    return ("path", os.fspath(src))


def _python() -> str:
    return os.environ.get("PTESTORE_ET_PYTHON", sys.executable)


def _split_log(stderr_text: str) -> dict[int, str]:
    logs: dict[int, str] = {}
    current: int | None = None
    chunks: list[str] = []
    for line in stderr_text.splitlines(keepends=True):
        if line.startswith(_JOB_MARK):
            if current is not None:
                logs[current] = "".join(chunks)
            try:
                current = int(line[len(_JOB_MARK) :].split()[0])
            except (ValueError, IndexError):
                current = None
            chunks = []
        elif current is not None:
            chunks.append(line)
    if current is not None:
        logs[current] = "".join(chunks)
    return logs


def run_programs(
    jobs: Sequence[Job],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    python: str | None = None,
) -> list[Result]:
    """Runs all jobs in as few child processes as possible; returns one Result per job, in
    order.  ``timeout`` bounds each child process (a hang is reported as a crash of the job
    that was running, returncode None)."""
    payload = [
        {
            "pte": _source_payload(j.pte),
            "ptd": _source_payload(j.ptd),
            "method": j.method,
            "inputs": [np.ascontiguousarray(a) for a in j.inputs],
            "load_mode": j.load_mode,
            "verification": j.verification,
        }
        for j in jobs
    ]
    results: list[Result | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="ptestore-et-") as tmp:
        jobs_file = Path(tmp) / "jobs.pkl"
        with jobs_file.open("wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        start = 0
        attempt = 0
        while start < len(jobs):
            attempt += 1
            results_file = Path(tmp) / f"results-{attempt}.pkl"
            stderr_file = Path(tmp) / f"stderr-{attempt}.txt"
            cmd = [python or _python(), str(Path(__file__).resolve()), str(jobs_file)]
            cmd += [str(results_file), str(start)]
            returncode: int | None
            with stderr_file.open("wb") as err:
                try:
                    proc = subprocess.run(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        timeout=timeout,
                        check=False,
                    )
                    returncode = proc.returncode
                except subprocess.TimeoutExpired:
                    returncode = None
            logs = _split_log(stderr_file.read_text(errors="replace"))
            done: dict[int, dict[str, Any]] = {}
            if results_file.exists():
                with results_file.open("rb") as f:
                    while True:
                        try:
                            idx, rec = pickle.load(f)
                        except (EOFError, pickle.UnpicklingError):
                            break
                        done[idx] = rec
            i = start
            while i < len(jobs) and i in done:
                rec = done[i]
                results[i] = Result(
                    index=i,
                    label=jobs[i].label,
                    outputs=rec.get("outputs"),
                    error=rec.get("error"),
                    log=logs.get(i, ""),
                    method_names=rec.get("method_names", []),
                )
                i += 1
            if i < len(jobs):
                # The child stopped while running job i (or could not start at all).
                tail = logs.get(i)
                if tail is None:
                    tail = stderr_file.read_text(errors="replace")[-4000:]
                results[i] = Result(
                    index=i,
                    label=jobs[i].label,
                    error=f"child process died (returncode {returncode})",
                    crashed=True,
                    returncode=returncode,
                    log=tail,
                )
                i += 1
            start = i
    return [r for r in results if r is not None]


def run_one(job: Job, **kwargs: Any) -> Result:
    """Convenience: a batch of one."""
    return run_programs([job], **kwargs)[0]


# --------------------------------------------------------------------------- child side


def _child_main(jobs_path: str, results_path: str, start: int) -> int:  # pragma: no cover
    from ptestore.xnnpack.native import bindings

    # The bindings' extension itself, also under the wrapper's name: ``portable_lib``
    # re-exports the same names but imports the exporter (``executorch.exir``) for one
    # warning class, 9 of the 12 s this child needed before its first load. The
    # ``executorch.runtime`` API below imports the wrapper by that name.
    portable_lib = bindings()
    sys.modules.setdefault("executorch.extension.pybindings.portable_lib", portable_lib)
    import torch
    from executorch.runtime import Runtime, Verification

    with open(jobs_path, "rb") as f:
        jobs: list[dict[str, Any]] = pickle.load(f)
    runtime = Runtime.get()
    keep_alive: list[Any] = []
    # inside the parent's temporary directory, which it removes whatever became of us
    tmpdir = tempfile.mkdtemp(prefix="child-", dir=os.path.dirname(os.path.abspath(jobs_path)))

    def as_path(src: tuple[str, Any], name: str) -> str:
        kind, value = src
        if kind == "path":
            return str(value)
        p = os.path.join(tmpdir, name)
        with open(p, "wb") as fh:
            fh.write(value)
        return p

    def as_bytes(src: tuple[str, Any]) -> bytes:
        kind, value = src
        if kind == "bytes":
            return bytes(value)
        with open(value, "rb") as fh:
            return fh.read()

    def to_numpy(v: Any) -> np.ndarray:
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().clone().numpy()
        return np.asarray(v)

    with open(results_path, "ab") as out:
        for i in range(start, len(jobs)):
            job = jobs[i]
            sys.stderr.write(f"{_JOB_MARK}{i} ===\n")
            sys.stderr.flush()
            rec: dict[str, Any] = {}
            try:
                verification = (
                    Verification.InternalConsistency
                    if job["verification"] == "internal"
                    else Verification.Minimal
                )
                inputs = [torch.from_numpy(np.array(a, copy=True)) for a in job["inputs"]]
                if job["ptd"] is None:
                    data: Any
                    if job["load_mode"] == "bytes":
                        data = as_bytes(job["pte"])
                    else:
                        data = as_path(job["pte"], f"job{i}.pte")
                    keep_alive.append(data)
                    program = runtime.load_program(data, verification=verification)
                    rec["method_names"] = sorted(program.method_names)
                    method = program.load_method(job["method"])
                    outs = method.execute(inputs)
                    keep_alive.append(program)
                else:
                    pverif = (
                        portable_lib.Verification.InternalConsistency
                        if job["verification"] == "internal"
                        else portable_lib.Verification.Minimal
                    )
                    if job["load_mode"] == "bytes":
                        pte_b = as_bytes(job["pte"])
                        ptd_b = as_bytes(job["ptd"])
                        keep_alive += [pte_b, ptd_b]
                        module = portable_lib._load_for_executorch_from_buffer(
                            pte_b, ptd_b, program_verification=pverif
                        )
                    else:
                        module = portable_lib._load_for_executorch(
                            as_path(job["pte"], f"job{i}.pte"),
                            data_path=as_path(job["ptd"], f"job{i}.ptd"),
                            program_verification=pverif,
                        )
                    keep_alive.append(module)
                    rec["method_names"] = sorted(module.method_names())
                    outs = module.run_method(job["method"], tuple(inputs))
                rec["outputs"] = [to_numpy(o) for o in outs]
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"
            sys.stderr.flush()
            pickle.dump((i, rec), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
