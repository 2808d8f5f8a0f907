"""Which failures of the runtime are remembered as a refusal, and the refusal record.

A refusal of the runtime is remembered beside the file (``xnnpack-<id>.refused.json``)
only when making the file again would fail the same way: the child's own refusal (exit
3: a method the probe cannot run, the runtime's error), outputs that differ, a graph
the runtime does not persist, a file ptestore rejects, or a crash by a signal the
program raises itself (:data:`DETERMINISTIC_SIGNALS`: SIGSEGV, SIGILL, SIGABRT...). A
failure that may pass is never remembered
(:attr:`~ptestore.errors.PackedWeightsRefused.transient`): the child did not finish in
time, was killed from outside (SIGKILL by the OOM killer, SIGTERM...), exited with
another status (an import error, a full disk in the child), or died of SIGBUS.

SIGBUS is the kernel's answer to a page of a mapped file it cannot provide: the runtime
writes the packed file through a shared mapping of a sparse file, so on a full disk (or
quota) the first page that needs a block kills the child with SIGBUS; so does an I/O
error under a mapping, or a mapped file cut short meanwhile. Each is the state of a
disk, not a property of the program (the runtime's own bad accesses are SIGSEGV on
x86-64 and arm64 Linux; a rare misaligned atomic access on arm64 is run again at each
call rather than remembered), so it is transient whatever the free space says
(:data:`MAPPED_FILE`: a quota or an I/O error shows in no free-space count).

The child's own refusal whose reason or messages name an allocation failure
(:func:`out_of_memory`: the runtime's load error of a failed allocation, XNNPACK's
``xnn_status_out_of_memory`` in its log) is not remembered either: a runtime that could
not allocate refuses the way a program it cannot run does, and the next call may have
the memory.

SIGABRT is also how the C++ runtime ends when an allocation fails (an uncaught
``std::bad_alloc``), which may pass. So an abort is remembered only when it happens
twice in a row (:mod:`.runs` runs the child once more at once, its half-made files
removed) and neither run's messages name an allocation failure (:func:`out_of_memory`:
``std::bad_alloc``, ``out of memory``, ``Cannot allocate memory``); an abort that names
one is transient, whichever run it is.

A record whose reason is of a failure that may pass by these rules
(:func:`transient_reason`) is not a refusal, whatever its ``"kind"``: one written before
kinds were recorded, or a SIGBUS an earlier version remembered as deterministic (the
next call makes the file and replaces it). A record that is not a regular file, too
large, not JSON or without a reason is not a refusal either.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

from ..errors import FormatError, PackedWeightsRefused
from .identity import Identity
from .record import publish_read_only, read_small

__all__ = [
    "DEFAULT_TIMEOUT",
    "DETERMINISTIC_SIGNALS",
    "MAPPED_FILE",
    "out_of_memory",
    "read_refusal",
    "signal_name",
    "transient_reason",
    "write_refusal",
]

#: Seconds each child of a make may take when ``ensure`` and the fleet make a file
#: (:func:`~ptestore.xnnpack.make_cache` itself waits as long as it takes unless told).
DEFAULT_TIMEOUT = 3600.0
#: The signals a crash of the runtime raises itself: making the file again crashes again.
#: Not SIGBUS: a page of a mapped file the kernel cannot provide (see the module).
DETERMINISTIC_SIGNALS = frozenset(
    int(getattr(signal, name))
    for name in ("SIGSEGV", "SIGILL", "SIGABRT", "SIGFPE", "SIGTRAP", "SIGSYS")
    if hasattr(signal, name)
)
#: What the reason of a crash by SIGBUS adds (:mod:`.runs`): why it may pass.
MAPPED_FILE = (
    "SIGBUS: a page of a file the runtime mapped could not be read or written, "
    "e.g. a full disk or quota, an I/O error"
)
#: What the child's messages say when an allocation failed (libstdc++'s terminate handler
#: names the ``std::bad_alloc``; C and Python runtimes say "out of memory" or ENOMEM's text;
#: XNNPACK's status ``xnn_status_out_of_memory``, which ExecuTorch's delegate logs before it
#: returns its own error; the bindings' load error 0x21, 0x25 or 0x31: ExecuTorch's
#: ``MemoryAllocationFailed``, ``OutOfResources``, ``DelegateMemoryAllocationFailed``).
_OUT_OF_MEMORY = re.compile(
    r"std::bad_alloc|out of memory|cannot allocate memory|xnn_status_out_of_memory"
    r"|\berror:? 0x:?(?:21|25|31)\b",
    re.IGNORECASE,
)
#: A refusal record is at most this many bytes.
MAX_REFUSAL_BYTES = 64 << 10
#: How the reasons of failures that may pass begin (records without a ``"kind"``).
_TRANSIENT = re.compile(
    r"the runtime did not finish |the runtime exited with -?\d+ |the runtime ran out of memory "
    r"|the ExecuTorch runtime crashed \((?!"
    + "|".join(signal.Signals(s).name for s in sorted(DETERMINISTIC_SIGNALS))
    + r")"
)


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def out_of_memory(messages: str) -> bool:
    """Whether the child's ``messages`` (its stderr) say an allocation failed."""
    return _OUT_OF_MEMORY.search(messages) is not None


def transient_reason(reason: str) -> bool:
    """Whether ``reason`` (a refusal's, as recorded by an earlier version or in a fleet's
    index) is one of a failure that may pass: a timeout, a kill from outside, a crash by
    a signal not in :data:`DETERMINISTIC_SIGNALS` (SIGBUS among them), an exit without
    the child's own reason."""
    return _TRANSIENT.match(reason) is not None


def read_refusal(path: Path) -> str | None:
    """The reason remembered at ``path`` for refusing again without running anything;
    None when there is none, or what is there is no refusal to keep (a failure that may
    pass by today's rules, recorded by an earlier version whatever its ``"kind"``, or a
    damaged record)."""
    try:
        data: Any = json.loads(read_small(path, MAX_REFUSAL_BYTES, "refusal record"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, FormatError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
        return None
    reason: str = data["reason"]
    if transient_reason(reason):
        return None
    return reason


def write_refusal(path: Path, identity: Identity, exc: PackedWeightsRefused) -> None:
    """Remember ``exc`` at ``path`` (never a transient one: see the module)."""
    assert not exc.transient
    record = {"identity": identity.to_json(), "reason": exc.reason, "kind": "deterministic"}
    publish_read_only(json.dumps(record).encode(), path)
