"""The rules a run follows whichever way it writes (the pipeline to new files, or in
place through a journal): what ``strict``/``allow_unchanged`` mean, a run that
specialized nothing, and the provenance stamper it starts with. A module of their own
so that an in-place run does not import the pipeline's layout and writers (start-up is
measured on devices)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, NothingSpecialized
from ..storage.types import DataLoader
from .report import SpecializationReport, nothing_specialized_message

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..provenance.stamp import ProvenanceRequest, Stamper

__all__ = [
    "check_run_arguments",
    "refuse_nothing_specialized",
    "refuse_unchanged",
    "start_provenance",
]


def check_run_arguments(device: object, provenance: object, event_tracer: object) -> None:
    """Refuse, before any work, a ``device`` that is not a ``DeviceProfile`` (a backend
    would get a name where it reads ``.name`` and ``.options``), a ``provenance`` that
    is neither a flag nor a request (``"no"`` would write a trailer) and an
    ``event_tracer`` that cannot be called: each a ``ConfigurationError`` naming it."""
    from .._args import callable_argument, device_argument

    if device is not None:
        from ..backends.compat import DeviceProfile

        device_argument(device, DeviceProfile)
    if not isinstance(provenance, bool):
        from ..provenance.stamp import ProvenanceRequest

        if not isinstance(provenance, ProvenanceRequest):
            from .._text import shown

            raise ConfigurationError(
                f"provenance must be True, False or a ProvenanceRequest, got {shown(provenance)}"
            )
    callable_argument(event_tracer, "event_tracer")


def start_provenance(
    provenance: ProvenanceRequest | bool,
    backends: Iterable[BackendLike] | None,
    device: DeviceProfile | None,
    sources: Sequence[tuple[str, DataLoader]],
) -> Stamper | None:
    """The run's :class:`~ptestore.provenance.stamp.Stamper` (None without provenance),
    already describing ``sources`` (in a thread of its own for a large local file). The
    run then calls ``stamper.backends``: each SPEC loaded once, for the call and the
    record alike."""
    if not provenance:
        return None
    from ..provenance.stamp import ProvenanceRequest, Stamper

    request = provenance if isinstance(provenance, ProvenanceRequest) else None
    stamper = Stamper(request or ProvenanceRequest(), backends, device)
    stamper.describe_sources(sources)
    return stamper


def refuse_nothing_specialized(summary: SpecializationReport) -> None:
    """Raise :class:`~ptestore.errors.NothingSpecialized` when no backend specialized
    anything (before anything is written)."""
    if not summary.specialized:
        raise NothingSpecialized(
            nothing_specialized_message(summary) or "nothing was specialized",
            backend_ids=tuple(b.backend_id for b in summary.backends),
            installed=tuple(summary.installed_backends),
            hint=summary.hint,
        )


def refuse_unchanged(strict: bool | None, allow_unchanged: bool) -> bool:
    """Whether a run that specialized nothing raises ``NothingSpecialized`` (one rule
    for Python and the CLI: yes, unless ``allow_unchanged=True`` or ``strict=False``)."""
    if not isinstance(allow_unchanged, bool):
        raise ConfigurationError(f"allow_unchanged must be True or False, got {allow_unchanged!r}")
    if strict is not None and not isinstance(strict, bool):
        raise ConfigurationError(f"strict must be True, False or None, got {strict!r}")
    if strict and allow_unchanged:
        raise ConfigurationError(
            "strict=True and allow_unchanged=True contradict each other: pass one of them"
        )
    return not allow_unchanged and strict is not False
