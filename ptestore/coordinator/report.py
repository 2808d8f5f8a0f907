"""What a run tells its caller: progress events while it runs, a report at the end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["BackendReport", "Event", "EventTracer", "FileReport", "SpecializationReport"]


@dataclass(frozen=True)
class Event:
    """A progress event passed to ``event_tracer``.

    ``kind`` is one of ``"parsed"``, ``"backend_start"``, ``"input"`` (a delegate blob
    handed to a backend), ``"replacement"`` (a blob received), ``"backend_end"``,
    ``"write"`` (bytes written to an output; ``done``/``total`` count the run's output
    bytes), ``"publish"``.
    """

    kind: str
    backend: str | None = None
    method: str | None = None
    key: str | None = None
    nbytes: int = 0
    done: int = 0
    total: int = 0
    seconds: float = 0.0
    url: str | None = None
    status: str | None = None


EventTracer = Callable[[Event], None]


@dataclass
class BackendReport:
    """What one backend id did."""

    backend_id: str
    implementation: str | None
    #: ``"specialized"``, ``"not_supported"`` (the backend declined) or
    #: ``"no_implementation"`` (nothing registered for this id).
    status: str
    inputs_seen: int = 0
    keys_replaced: list[str] = field(default_factory=list)
    blobs_replaced: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


@dataclass
class FileReport:
    """What happened to one output file."""

    role: str
    source: str
    destination: str
    size_before: int
    size_after: int
    segments: int
    segments_replaced: int
    segments_moved: int
    redirected_tables: int
    bytes_copied: int
    bytes_replaced: int


@dataclass
class SpecializationReport:
    """The result of one run: one entry per backend id and per output file."""

    backends: list[BackendReport]
    files: list[FileReport]
    seconds: float
    #: Backends given explicitly whose id does not occur in the program (a typo?).
    unused_backends: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
