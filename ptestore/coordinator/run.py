"""The state of one run: its source files (:func:`read_sources`, the first step), the
merged named data, and the replacements every backend committed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._dataclass import dataclass
from ..errors import ConfigurationError, FormatError, MissingNamedData
from ..format.reader import read_container
from ..format.xnnheader import check_xnnpack_blobs
from ..provenance.trailer import without_trailer
from .named import MergedNamedDataMap, SourceFile
from .report import Event, EventTracer, current_ptd_spelling
from .spool import Spool

if TYPE_CHECKING:
    from ..format.reader import ParsedFile
    from ..format.tensorinfo import TensorInfo
    from ..storage.types import DataLoader
    from ..writers.base import DataWriter

__all__ = ["Replacement", "Run", "SegmentKey", "read_sources"]

#: ``(role, segment index)``: one segment of one file of the run.
SegmentKey = tuple[str, int]


@dataclass
class Replacement:
    """New bytes for one user of a segment, held in the spool."""

    spool_offset: int
    size: int
    alignment: int
    backend: str
    user: str  # "key 'abc'" or "delegate forward[0]"

    def sha256(self, spool: DataLoader) -> str:
        """SHA-256 of these bytes, read back from ``spool`` (only where a segment has
        several replacements to tell apart: hashing every replacement as it is spooled
        cost a pass over all of a backend's output, 10 ms per 16 MiB)."""
        import hashlib

        from .._io import read_pieces

        h = hashlib.sha256()
        for piece in read_pieces(spool, self.spool_offset, self.size):
            h.update(piece)
        return h.hexdigest()


class Run:
    """State shared by all backends of one specialization run."""

    def __init__(self, files: list[SourceFile], spool: Spool, tracer: EventTracer | None) -> None:
        self.files = files
        self.pte = files[0]
        self.spool = spool
        self.tracer = tracer
        #: How the caller is given the model's .ptd, as the run's hints name it: taken
        #: once, now (:func:`~.report.ptd_spelling`), whichever thread reads a key later
        self.ptd_spelling = current_ptd_spelling()
        self.named = MergedNamedDataMap(files, self.ptd_spelling)
        #: segment -> replacements (one per user that replaced it)
        self.replacements: dict[SegmentKey, list[Replacement]] = {}
        self.written_keys: dict[str, str] = {}  # key -> backend
        self.replaced_blobs: dict[int, str] = {}  # pte segment -> backend
        #: backend id -> the spec of the implementation called for it (for messages)
        self.specs: dict[str, str | None] = {}

    def file(self, role: str) -> SourceFile:
        return next(f for f in self.files if f.role == role)

    def replaced_keys(self) -> frozenset[str]:
        return frozenset(self.written_keys)

    def emit(self, event: Event) -> None:
        if self.tracer is not None:
            self.tracer(event)


def read_sources(
    pte_loader: DataLoader,
    pte_writer: DataWriter,
    ptd_loader: DataLoader | None,
    ptd_writer: DataWriter | None,
) -> list[SourceFile]:
    """The .pte (and .ptd) of a run, their metadata read through their loaders (ranged
    reads only); a trailer a source may end with is hidden (not part of its container).
    The first bytes of every XNNPACK blob are checked as the runtime checks them
    (:func:`~ptestore.format.xnnheader.check_xnnpack_blobs`), a pair by
    :func:`check_pair` and a .pte alone by :func:`check_alone`: all before any backend
    runs."""
    pte_loader = without_trailer(pte_loader)
    files = [SourceFile("pte", pte_loader, pte_writer, read_container(pte_loader))]
    if files[0].container.kind != "pte":
        raise ConfigurationError(f"{pte_loader.name}: expected a .pte, found a .ptd")
    check_xnnpack_blobs(files[0].container, files[0].parsed.metadata, pte_loader)
    if ptd_loader is not None and ptd_writer is not None:
        ptd_loader = without_trailer(ptd_loader)
        files.append(SourceFile("ptd", ptd_loader, ptd_writer, read_container(ptd_loader)))
        if files[1].container.kind != "ptd":
            raise ConfigurationError(f"{ptd_loader.name}: expected a .ptd, found a .pte")
        check_pair(files[0], files[1])
    else:
        check_alone(files[0])
    return files


def check_alone(pte: SourceFile) -> None:
    """Refuse a .pte run without a .ptd whose own named-data value is shorter than a
    description of its key (an XNNPACK graph's constant, an EXTERNAL tensor), as
    :func:`check_pair` does for a pair: the runtime reads past the value's end (a crash,
    or other bytes as weights). A .pte that holds no named data has nothing to check;
    else the sizes its graphs say are read (:func:`~ptestore.format.sizes.may_be_short`),
    and the tensors described only for a value that may be short: a local run imports
    no tensor descriptions (tests/device/test_startup.py)."""
    if not pte.container.named_data:
        return
    from ..format.sizes import may_be_short  # a .pte that holds named data only

    if may_be_short(pte.parsed, pte.loader):
        from ..format.tensors import read_tensors, short_values

        described = read_tensors(pte.parsed, pte.loader, strict=False)
        refuse_short(short_values(pte.parsed, None, described))


def check_pair(pte: SourceFile, ptd: SourceFile) -> None:
    """Refuse a pair the runtime cannot load or would read wrongly, before any backend
    runs: a named-data key the .pte reads that neither file holds (a .ptd of another
    model or export: error 0x20, or a crash of an XNNPACK program), and a value shorter
    than a description of its key (the runtime reads past its end: other bytes as
    weights, or a crash). Reads only the XNNPACK graphs' FlatBuffers."""
    # only for a run with a .ptd
    from ..format.tensors import layout_tensors, read_tensors, short_values, unheld_keys

    described = read_tensors(pte.parsed, pte.loader, strict=False)  # as the runtime
    unheld = unheld_keys(pte.parsed, pte.loader, ptd.parsed, described)
    names = (str(pte.container.source), str(ptd.container.source))
    if unheld:
        key, info = unheld[0]
        more = f" (and {len(unheld) - 1} other keys)" if len(unheld) > 1 else ""
        raise MissingNamedData(
            f"{names[0]}: named data key {key!r}, read by {described_by(info)}, is in "
            f"neither {names[0]} nor {names[1]}{more}: is {names[1]} the .ptd this .pte "
            "was exported with? The runtime cannot load this pair (a key it does not find "
            "is error 0x20)",
            key=key,
            files=names,
        )
    refuse_short(short_values(pte.parsed, ptd.parsed, described + layout_tensors(ptd.parsed)))


def refuse_short(short: list[tuple[str, ParsedFile, int, TensorInfo]]) -> None:
    """The error for the values :func:`~ptestore.format.tensors.short_values` found
    shorter than their descriptions (the first named, the others counted), if any."""
    if short:
        key, parsed, size, info = short[0]
        more = f"; {len(short) - 1} other values are short too" if len(short) > 1 else ""
        raise FormatError(
            str(parsed.container.source),
            f"named data {key!r} (size)",
            size,
            f">= {info.nbytes} bytes: {info.dtype} {list(info.shape)}, as {described_by(info)} "
            "says",
            f"the runtime reads {info.nbytes} bytes from the value's start, past its end{more}",
        )


def described_by(info: TensorInfo) -> str:
    """Who describes a key, for messages: the program's EXTERNAL tensor, an XNNPACK
    graph, or a .ptd's tensor layout."""
    if info.source == "program":
        return f"the program's EXTERNAL tensor {info.where}"
    if info.source == "ptd":
        return f"the tensor layout of {info.where}"
    return f"the XnnpackBackend graph's {info.where}"
