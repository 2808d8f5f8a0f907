"""What a run tells its caller: progress events while it runs, a report at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from .._dataclass import dataclass, field
from .._text import printable

__all__ = [
    "BackendReport",
    "Event",
    "EventTracer",
    "FileReport",
    "SpecializationReport",
    "current_ptd_spelling",
    "no_named_data_hint",
    "nothing_specialized_message",
    "pass_ptd",
    "ptd_spelling",
    "served_unchanged_message",
]

#: How ``specialize`` is given a model's .ptd (CLI, Python): the spelling of
#: :func:`pass_ptd` unless a caller names its own (``ensure``: :data:`ENSURE_PTD`).
SPECIALIZE_PTD = ("--ptd SRC_PTD DST_PTD", "ptd=(src, dst)")
#: How ``ensure`` is given a model's .ptd.
ENSURE_PTD = ("--ptd PTD", "ptd=PATH")

#: The spelling of the .ptd hint of a run made in this context (:func:`ptd_spelling`).
_SPELLING: ContextVar[tuple[str, str]] = ContextVar("ptestore_ptd_spelling", default=SPECIALIZE_PTD)


@contextlib.contextmanager
def ptd_spelling(spelling: tuple[str, str]) -> Iterator[None]:
    """``with ptd_spelling(ENSURE_PTD): specialize(...)``: a run made inside the block
    hints at the model's .ptd in these words (:func:`pass_ptd`), the caller's, not
    ``specialize``'s: its :class:`~ptestore.errors.MissingNamedData` (and so the
    ``BackendError`` that quotes the one a backend got) and the hint of its report when
    nothing was specialized.

    The run takes the spelling once, when it is made
    (:class:`~ptestore.coordinator.run.Run`), and keeps it: the errors it raises later,
    in a backend's own threads too, and whoever catches them see the words it was made
    with. A context variable rather than a keyword argument: ``ensure`` reaches its runs
    through the public entry points (``specialize``, then ``specialize_pair`` and
    ``initialize_and_save_backend_data``; the in-place run), which need no argument for
    the wording of one hint; and rather than a module global: a run that another
    thread makes meanwhile keeps ``specialize``'s words."""
    token = _SPELLING.set(spelling)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def current_ptd_spelling() -> tuple[str, str]:
    """The spelling a run made now takes for its .ptd hint (:func:`ptd_spelling`;
    ``specialize``'s outside any)."""
    return _SPELLING.get()


def pass_ptd(spelling: tuple[str, str] = SPECIALIZE_PTD) -> str:
    """The one text of the hint that a run needs the model's .ptd: ``"pass it (CLI:
    ...; Python: ...)"``, in the spelling of the command that ran (``(cli, python)``)."""
    cli, python = spelling
    return f"pass it (CLI: {cli}; Python: {python})"


def no_named_data_hint(spelling: tuple[str, str] = SPECIALIZE_PTD) -> str:
    """The hint of a run that specialized nothing in a .pte holding no named data of
    its own, given without a .ptd (:func:`pass_ptd`)."""
    return (
        "The .pte holds no named data of its own: if this program keeps its weights in "
        f"a .ptd, {pass_ptd(spelling)}."
    )


@dataclass(frozen=True)
class Event:
    """A progress event passed to ``event_tracer``.

    ``kind`` is one of ``"parsed"``, ``"backend_start"``, ``"input"`` (a delegate blob
    handed to a backend), ``"replacement"`` (a blob received), ``"backend_end"``,
    ``"write"`` (bytes written to an output; ``done``/``total`` count the run's output
    bytes), ``"publish"``; and from ``ensure`` of a job index, ``"fetch"`` (bytes put
    in place; ``done``/``total`` count that file's bytes, ``url`` names it, ``status``
    says where they came from: ``"store"`` downloaded, ``"base"`` taken from a file the
    cache held, ``"part"`` a download resumed).
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
    #: The implementation's spec: the SPEC string given, the installed backend's
    #: registered or entry-point name, or ``package.module:Class`` for an object.
    implementation: str | None
    #: ``"specialized"``, ``"not_supported"`` (the backend declined: it raised
    #: ``NotSupported``, or returned without writing anything) or
    #: ``"no_implementation"`` (nothing registered for this id).
    status: str
    #: How many unique delegate inputs (blobs) the backend asked for.
    inputs_seen: int = 0
    keys_replaced: list[str] = field(default_factory=list)
    blobs_replaced: int = 0
    #: Bytes the backend read: every delegate blob it was handed plus every named-data
    #: value it read with ``get_data``/``get_array`` (a value read twice counts twice).
    bytes_in: int = 0
    #: Bytes of the replacements it submitted.
    bytes_out: int = 0
    seconds: float = 0.0
    #: Why it declined (``status == "not_supported"``): the ``NotSupported`` message,
    #: or that it wrote nothing.
    reason: str | None = None


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
    #: ``"written"``, or ``"unchanged"`` when nothing in the file was replaced, its
    #: layout stayed the same and the destination is the source: nothing was written
    #: or published; for a .ptd stored by content (``ptd_store``): ``"shared"``
    #: (written at its content address, ``destination``) or ``"stored"`` (found there
    #: with the same bytes: nothing written).
    status: str = "written"
    #: The destination's clone granularity (copy-on-write block size) the layout kept
    #: unchanged segments congruent to, or None when the writer cannot clone from the
    #: source.
    clone_block_size: int | None = None
    #: Bytes the writer shared with the source instead of copying (reflink).
    bytes_cloned: int = 0
    #: Extra padding the clone-congruent layout added to the file (0 when nothing
    #: moved or no clone block size applies).
    clone_padding: int = 0
    #: What the publish returned (None until published, or when the storage reports
    #: no such value): the published size, ETag, version id and verified checksum.
    published_size: int | None = None
    etag: str | None = None
    version_id: str | None = None
    checksum: str | None = None
    #: The digest of the bytes before the trailer, as the file's provenance record names
    #: it (``sha256-tree:<hex>``): None without provenance or when nothing was written.
    content_digest: str | None = None


@dataclass
class SpecializationReport:
    """The result of one run: one entry per backend id and per output file."""

    backends: list[BackendReport]
    files: list[FileReport]
    seconds: float
    #: Backends given explicitly whose id does not occur in the program (a typo?).
    unused_backends: list[str] = field(default_factory=list)
    #: The source .pte.
    source: str = ""
    #: Why nothing was specialized (None when something was, or when ``passthrough``
    #: was named explicitly: an unchanged copy is then what was asked for).
    unchanged_reason: str | None = None
    #: What to do about it, when something specific is known.
    hint: str | None = None
    #: The installed backends as ``"name (spec, serves ID)"`` for a registration and
    #: ``"name (module:attr)"`` for an entry point (from the metadata: no module is
    #: imported for it); filled in only when nothing was specialized.
    installed_backends: list[str] = field(default_factory=list)

    @property
    def specialized(self) -> bool:
        """Whether the run did what was asked (see :attr:`unchanged_reason`)."""
        return self.unchanged_reason is None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = asdict(self)
        out["specialized"] = self.specialized
        return out


def nothing_specialized_message(
    report: SpecializationReport, spelling: tuple[str, str] = SPECIALIZE_PTD
) -> str | None:
    """The message for a run that specialized nothing (None if it did): why, the
    backend ids in the program, the installed backends and the hint (a .ptd to pass
    named in ``spelling``, the caller's: :func:`pass_ptd`; a hint the run made in other
    words than ``specialize``'s, :func:`ptd_spelling`, is left as it is). The text of
    :class:`~ptestore.errors.NothingSpecialized` under ``strict=True``."""
    if report.unchanged_reason is None:
        return None
    ids = ", ".join(printable(b.backend_id) for b in report.backends) or "none"  # the file's
    installed = "; ".join(report.installed_backends) or "none"
    where = f" in {report.source}" if report.source else ""
    msg = (
        f"nothing was specialized{where}: {report.unchanged_reason}. "
        f"Backend ids in the program: {ids}. Installed backends: {installed}."
    )
    if report.hint:
        hint = report.hint
        if spelling != SPECIALIZE_PTD:  # the run's hint, in the caller's words
            hint = hint.replace(pass_ptd(), pass_ptd(spelling))
        msg += f" {hint}"
    return msg


def served_unchanged_message(report: SpecializationReport, key: str) -> str | None:
    """What ``ensure`` logs (a warning) when its run specialized nothing and it caches
    and serves the model unchanged all the same (None if the run specialized): the
    message :class:`~ptestore.errors.NothingSpecialized` would have (its hint in
    ``ensure``'s words, :data:`ENSURE_PTD`: the run was made in them,
    :func:`ptd_spelling`), and what was done instead."""
    message = nothing_specialized_message(report)
    if message is None:
        return None
    return (
        f"{message} ensure serves the model unchanged all the same (cache entry {key}, "
        "specialized: false)."
    )
