"""What a packed-weight file is bound to: artifact x ExecuTorch build x CPU fingerprint.

XNNPACK's own file has no such binding: its entries are keyed by named-data key (a
rewritten artifact with the same keys silently runs the old weights) and its "seed" (an
XOR of shapes and tile sizes) names neither the XNNPACK version nor the CPU. ptestore
names the file after all three, so a file made for another artifact, runtime or CPU is
never found, let alone handed out.

The CPU fingerprint is the machine, the page size (the file's regions are page-aligned),
on arm64 the first core's ``MIDR_EL1`` (implementer, part, variant, revision: XNNPACK
picks some kernels by the core's microarchitecture; read from
``/sys/devices/system/cpu/cpu0/regs/identification/midr_el1`` when the kernel exposes it)
and the ISA features that pick XNNPACK's kernels, read from ``/proc/cpuinfo`` (x86:
``flags``; arm64: ``Features``)::

    x86_64/page=4096:ssse3,sse4_1,sse4_2,avx,f16c,fma,avx2
    aarch64/page=4096/midr=0x410fd4c0:asimd,asimdhp,asimddp,fphp

A fingerprint is compared as a string only: one written by an earlier version (fewer
features, no ``midr``) is another CPU's, so its file is made again, never misread.

Not in it: the x86 microarchitecture, by which XNNPACK also picks the fp32 GEMM kernels
of an FMA3 CPU without AVX-512F (AMD Zen/Zen+ and Hygon get ones with another packing).
Two such CPUs with the same features share a fingerprint; a file made on one is of no
use on the other (the runtime repacks at every load, outputs unchanged). Why it is left
out: docs/xnnpack.md, "What the file is bound to".
"""

from __future__ import annotations

import hashlib
import json
import os
import platform

from .._dataclass import dataclass
from .native import ExecutorchBuild

__all__ = [
    "ARM64_FEATURES",
    "MIDR_PATH",
    "X86_FEATURES",
    "Identity",
    "cpu_fingerprint",
    "file_sha256",
]

#: x86 flags that change which XNNPACK microkernels run (or their packing): each one
#: XNNPACK's hardware configuration asks cpuinfo for (SSSE3, XOP and GFNI included: the
#: AVX512-VNNI-GFNI and AVX256-VNNI-GFNI kernels need GFNI).
X86_FEATURES = (
    "ssse3",
    "sse4_1",
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "xop",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512cd",
    "avx512vbmi",
    "avx512_vnni",
    "gfni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni_int8",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",
)
#: arm64 features that do the same.
ARM64_FEATURES = (
    "asimd",
    "asimdhp",
    "asimddp",
    "fphp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
    "svei8mm",
    "svebf16",
    "sme",
    "sme2",
)


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


#: Where Linux exposes the first core's ``MIDR_EL1`` (arm64).
MIDR_PATH = "/sys/devices/system/cpu/cpu0/regs/identification/midr_el1"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _midr(text: str | None) -> str:
    """``/midr=0x<8 hex digits>`` of the register's text (``0x00000000410fd4c0``), or
    nothing when it is absent or unreadable."""
    try:
        value = int((text or "").strip(), 16)
    except ValueError:
        return ""
    return f"/midr=0x{value:08x}" if 0 < value < 1 << 64 else ""


def cpu_fingerprint(
    cpuinfo: str | None = None, machine: str | None = None, midr: str | None = None
) -> str:
    """``"<machine>/page=<bytes>[/midr=0x<hex>]:<feature>,..."`` for this CPU (or for the
    given ``/proc/cpuinfo`` text, machine name and ``midr_el1`` text), the features in a
    fixed order; ``midr`` on arm64 only (read from :data:`MIDR_PATH` unless given)."""
    machine = machine or platform.machine()
    if cpuinfo is None:
        cpuinfo = _read("/proc/cpuinfo") or ""
    flags = _cpu_flags(cpuinfo)
    arm64 = machine in ("aarch64", "arm64")
    known = ARM64_FEATURES if arm64 else X86_FEATURES
    page = os.sysconf("SC_PAGE_SIZE")
    core = _midr(midr if midr is not None else _read(MIDR_PATH)) if arm64 else ""
    return f"{machine}/page={page}{core}:" + ",".join(f for f in known if f in flags)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file, read in small pieces (:data:`ptestore._io.HASH_PIECE`)."""
    from .._io import HASH_PIECE

    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(HASH_PIECE)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


@dataclass(frozen=True)
class Identity:
    """The three things a packed-weight file is made for."""

    pte_sha256: str
    ptd_sha256: str | None
    executorch_version: str
    executorch_git: str
    cpu: str

    @classmethod
    def of(cls, pte_sha256: str, ptd_sha256: str | None, build: ExecutorchBuild) -> Identity:
        return cls(pte_sha256, ptd_sha256, build.version, build.git_version, cpu_fingerprint())

    def to_json(self) -> dict[str, str | None]:
        return {
            "pte_sha256": self.pte_sha256,
            "ptd_sha256": self.ptd_sha256,
            "executorch_version": self.executorch_version,
            "executorch_git": self.executorch_git,
            "cpu": self.cpu,
        }

    @property
    def name(self) -> str:
        """The file's base name: a hash of the identity (32 hex digits)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return "xnnpack-" + hashlib.sha256(text.encode()).hexdigest()[:32]

    def differences(self, other: dict[str, object]) -> list[str]:
        """The fields of a recorded identity that differ from this one, as
        ``"field: recorded != expected"``."""
        mine = self.to_json()
        return [f"{k}: {other.get(k)!r} != {v!r}" for k, v in mine.items() if other.get(k) != v]
