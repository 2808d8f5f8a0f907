"""An in-place run never specializes an output again: what a file's own provenance
trailer says about it (a specialized output, an unchanged copy, or nothing), and the one
refusal, :class:`~ptestore.errors.AlreadySpecialized`, with what to give instead (the
portable source). Used by :mod:`.inplace` and by the device's in-place ``ensure``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AlreadySpecialized

if TYPE_CHECKING:
    from ..provenance.record import Provenance

__all__ = [
    "PORTABLE_HINT",
    "describe_record",
    "refuse_specialized_output",
    "specialized_record",
]


def specialized_record(loader: Any, target: str) -> Provenance | None:
    """The provenance record of ``target`` when its trailer says it is a specialized
    output (its content differs from the source it was made from); None for a file
    without a trailer, or an unchanged copy's. A damaged trailer counts as one: nothing
    says what the file is."""
    from ..errors import FormatError
    from ..provenance import read_provenance

    try:
        record = read_provenance(loader)
    except FormatError as exc:
        raise AlreadySpecialized(
            f"{target}: its provenance trailer is damaged ({exc}), so nothing says whether "
            "it is a portable model or a specialized output; in place refuses to guess. "
            f"{PORTABLE_HINT}",
            path=target,
        ) from exc
    if record is None:
        return None
    if record.content is not None and record.content.sha256 == record.source.sha256:
        return None  # an unchanged copy: still the portable model
    return record


#: What to do when in place meets an already-specialized file.
PORTABLE_HINT = (
    "Give the portable source (the original .pte): ensure(..., in_place=True, "
    "portable=PATH) or `ptestore ensure SRC --in-place --portable PATH`; or specialize the "
    "portable source to this file (ptestore.specialize(PORTABLE, SRC))"
)


def describe_record(record: Provenance) -> str:
    """``backends [spec version, ...] for device NAME, made from URL (sha256 ...)``."""
    backends = ", ".join(f"{b.spec} {b.version}" for b in record.requested) or ", ".join(
        f"{b.spec} {b.version}" for b in record.backends
    )
    device = "no device" if record.device is None else f"device {record.device.name}"
    return (
        f"backends [{backends or 'none'}] for {device}, made from {record.source.url} "
        f"({record.source.sha256})"
    )


def refuse_specialized_output(loader: Any, target: str) -> None:
    """Raise :class:`AlreadySpecialized` when ``target`` is a specialized output: in
    place never specializes its own (or any) output again (the backends would apply
    twice: a doubled weight doubled again)."""
    record = specialized_record(loader, target)
    if record is None:
        return
    raise AlreadySpecialized(
        f"{target}: already specialized (its provenance trailer records "
        f"{describe_record(record)}); specializing it in place again would apply the "
        f"backends to their own output. {PORTABLE_HINT}",
        path=target,
        provenance=record,
    )
