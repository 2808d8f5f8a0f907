"""What a .pte's own descriptions say of the sizes of the named-data values it holds, read
without describing a tensor: the check a run of a .pte without its .ptd makes when it
reads its sources (:func:`may_be_short`), and the walks :mod:`.tensors` and
:mod:`.xnnpack` describe tensors from.

- :func:`xnnpack_graphs`: the XNNGraph FlatBuffer of every XNNPACK delegate of a .pte,
  each distinct byte range once (only each blob's header and FlatBuffer are read);
- :func:`graph_root`: a graph's root table and its ``constant_data`` entries, the named
  key and byte size of each (an XNNPACK graph's description of a key says as many bytes
  as its entry: :func:`~.xnnpack.parse_xnngraph`);
- :func:`tensor_values` and :func:`external_name`: every Tensor value of a program's
  execution plans, and the key of an EXTERNAL one.

No dtype table and no :class:`~.tensorinfo.TensorInfo` here: a local run of an XNNPACK
program pays for the sizes it reads, not for describing tensors
(tests/device/test_startup.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import FormatError
from .flatbuf import FlatView, TableView, WorkBudget
from .xnnheader import (
    XNN_HEADER_LENGTH,
    XNNPACK_BACKEND_ID,
    blob_source,
    check_identifier,
    xnngraph_span,
)

if TYPE_CHECKING:
    from ..storage.types import DataLoader
    from .reader import ParsedFile

__all__ = [
    "ConstantEntry",
    "external_name",
    "file_budget",
    "graph_root",
    "may_be_short",
    "program_root",
    "tensor_values",
    "xnnpack_graphs",
]

#: A ``constant_data`` entry of an XNNGraph: (named key, size), or None for an entry
#: without a key (bytes in the blob itself, or the empty entry 0).
ConstantEntry = tuple[str, int] | None

_UINT64_MAX = (1 << 64) - 1
# schema/program.fbs field ids
_PROGRAM_EXECUTION_PLAN = 1
_PLAN_NAME, _PLAN_VALUES = 0, 2
_EVALUE_TYPE, _EVALUE_VAL = 0, 1
_KERNEL_TYPE_TENSOR = 5
_T_EXTRA = 9
_EXTRA_FQN, _EXTRA_LOCATION = 1, 2
_LOCATION_EXTERNAL = 1
# backends/xnnpack/serialization/schema.fbs: XNNGraph.constant_data, ConstantDataOffset
_G_CONSTANT_DATA = 8
_CD_OFFSET, _CD_SIZE, _CD_NAMED_KEY = 0, 1, 2


def program_root(parsed: ParsedFile) -> TableView:
    """The ``Program`` table of a .pte, read without recording spans (nothing patches
    what the tensor walks read)."""
    c = parsed.container
    return FlatView(parsed.metadata, c.source, limit=c.metadata_size, track=False).root("Program")


def tensor_values(root: TableView) -> Iterator[tuple[str, int, TableView]]:
    """``(method, value index, Tensor table)`` of every Tensor value of every execution
    plan of the ``Program`` table ``root``."""
    plans = root.vector(_PROGRAM_EXECUTION_PLAN, "execution_plan", 4)
    if plans is None:
        return
    for p in range(plans.length):
        plan = plans.table(p)
        name = plan.string(_PLAN_NAME, "name") or f"execution_plan[{p}]"
        values = plan.vector(_PLAN_VALUES, "values", 4)
        if values is None:
            continue
        for i in range(values.length):
            ev = values.table(i)
            if ev.scalar(_EVALUE_TYPE, "val_type", "u8") != _KERNEL_TYPE_TENSOR:
                continue
            t = ev.table(_EVALUE_VAL, "val")
            if t is not None:
                yield name, i, t


def external_name(t: TableView) -> str | None:
    """The named-data key of the Tensor table ``t`` when its data is EXTERNAL (its fully
    qualified name, which must not be empty), else None."""
    extra = t.table(_T_EXTRA, "extra_tensor_info")
    if extra is None or extra.scalar(_EXTRA_LOCATION, "location", "u8") != _LOCATION_EXTERNAL:
        return None
    fqn = extra.string(_EXTRA_FQN, "fully_qualified_name")
    if not fqn:
        raise FormatError(
            t.view.source,
            f"{extra.field}.fully_qualified_name",
            fqn,
            "a non-empty string (the key of an EXTERNAL tensor)",
        )
    return fqn


def file_budget(parsed: ParsedFile) -> WorkBudget:
    """What the XNNPACK graphs of a file may cost together: their bytes read once (at
    most the file's size when they do not overlap) and each parse's own bound (twice its
    graph), with room to spare."""
    size = parsed.container.file_size
    return WorkBudget(4096 + 4 * size, f"the XNNPACK graphs of a {size}-byte file")


def xnnpack_graphs(
    parsed: ParsedFile, loader: DataLoader, budget: WorkBudget, *, strict: bool = True
) -> Iterator[tuple[bytes | bytearray | memoryview, str, str]]:
    """``(XNNGraph FlatBuffer, source, where)`` of every XNNPACK delegate graph of a
    .pte, one per distinct byte range of the file (delegates whose segments or inline
    blobs cover the same bytes share it): only each blob's header and FlatBuffer are
    read. The graph bytes read are charged to ``budget``, which the graphs' parses share
    too, so overlapping blobs cannot multiply the work beyond the file's size.
    ``strict=False`` (a run, which follows the runtime): an ``XH00`` header length below
    30 is not refused (:func:`~.xnnheader.parse_xnn_header`)."""
    c = parsed.container
    blobs: set[tuple[int, int]] = set()
    graphs: set[tuple[int, int]] = set()
    for d in c.delegates:
        if d.id != XNNPACK_BACKEND_ID:
            continue
        inline: memoryview | None = None
        if d.location == "segment":
            seg = c.segments[d.index]
            start, size = c.absolute(seg), seg.size
            where = f"segment {d.index}"
        else:
            start, size = c.inline_delegate_data[d.index]  # the metadata starts at byte 0
            inline = memoryview(parsed.metadata)[start : start + size]
            where = f"inline data {d.index}"
        if (start, size) in blobs:
            continue
        blobs.add((start, size))
        src = blob_source(c, d, where)
        if inline is None:
            head: bytes | memoryview = bytes(loader.load(start, min(size, XNN_HEADER_LENGTH)))
        else:
            head = inline[:XNN_HEADER_LENGTH]
        off, fb_size = xnngraph_span(head, size, src, strict=strict)
        if (start + off, fb_size) in graphs:
            continue
        graphs.add((start + off, fb_size))
        budget.spend(src, 1, fb_size, f"XNNGraph [{start + off}, {start + off + fb_size})")
        if inline is None:
            graph: bytes | bytearray | memoryview = loader.load(start + off, fb_size)
        else:
            graph = inline[off : off + fb_size]
        yield graph, src, f"{d.method}[{d.position}]"


def graph_root(
    buf: bytes | bytearray | memoryview, source: str, budget: WorkBudget | None
) -> tuple[TableView, list[ConstantEntry]]:
    """The root table of the XNNGraph FlatBuffer ``buf`` (its file identifier checked)
    and its ``constant_data`` entries, in order (an entry with a named key must have the
    offset UINT64_MAX); ``budget``, when given, is charged too."""
    view = FlatView(buf, source, limit=len(buf), budget=budget, track=False)
    check_identifier(buf[:8], source)
    root = view.root("XNNGraph")
    vec = root.vector(_G_CONSTANT_DATA, "constant_data", 4)
    if vec is None:
        return root, []
    out: list[ConstantEntry] = []
    for i in range(vec.length):
        t = vec.table(i)
        key = t.string(_CD_NAMED_KEY, "named_key") or ""
        offset = t.scalar(_CD_OFFSET, "offset", "u64")
        size = t.scalar(_CD_SIZE, "size", "u64")
        if key and offset != _UINT64_MAX:
            raise FormatError(
                source,
                f"{t.field}.offset",
                offset,
                f"UINT64_MAX for an entry with a named_key ({key!r})",
            )
        out.append((key, size) if key else None)
    return root, out


def may_be_short(pte: ParsedFile, loader: DataLoader) -> bool:
    """Whether a value the .pte holds may be shorter than a description of its key, from
    sizes alone (a run without its .ptd asks, when it reads its sources): an XNNPACK
    graph's ``constant_data`` entry says more bytes than the .pte holds for its key, or
    an EXTERNAL tensor names a key the .pte holds (its byte count needs its dtype). False
    is the answer: nothing is short. True needs the tensors described for the exact
    answer (:func:`~.tensors.short_values`: an entry that no value of its graph uses,
    the runtime never reads) and its words."""
    c = pte.container
    held = {e.key: c.segments[e.segment_index].size for e in c.named_data}
    if not held:
        return False
    budget = file_budget(pte)
    for graph, src, _ in xnnpack_graphs(pte, loader, budget, strict=False):
        for entry in graph_root(graph, src, budget)[1]:
            if entry is not None and entry[1] > held.get(entry[0], entry[1]):
                return True
    return any(external_name(t) in held for _, _, t in tensor_values(program_root(pte)))
