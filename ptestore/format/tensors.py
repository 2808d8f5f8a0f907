"""Tensor info for every named-data key a model describes.

:func:`describe_tensors` gathers, once, every description of a named-data key:

1. the XNNPACK delegate graphs (``source="xnnpack"``; only their FlatBuffer is read),
2. the program's EXTERNAL tensor values (``source="program"``; key = fully qualified name),
3. the .ptd tensor layouts (``source="ptd"``).

The first description found in that order is the key's :class:`TensorInfo`; different
descriptions of the same key are kept in its ``other_uses`` (the first
:data:`~.tensorinfo.MAX_OTHER_USES`, and a count of the rest in ``more_uses``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .._dataclass import replace
from ..storage.types import DataLoader
from .reader import ParsedFile
from .sizes import external_name, file_budget, program_root, tensor_values, xnnpack_graphs
from .tensorinfo import (
    MAX_OTHER_USES,
    TensorInfo,
    info_from_layout,
    read_dims,
    scalar_type_info,
)
from .xnnheader import XNNPACK_BACKEND_ID
from .xnnpack import PackedWeight, parse_packed_weights, parse_xnngraph

__all__ = [
    "XNNPACK_BACKEND_ID",
    "TensorIndex",
    "describe_tensors",
    "layout_tensors",
    "named_data_json",
    "tensor_index_of",
    "unheld_keys",
    "program_external_tensors",
    "read_tensors",
    "short_values",
    "xnnpack_packed_weights",
    "xnnpack_tensors",
]

# schema/program.fbs: Tensor
_T_SCALAR_TYPE, _T_SIZES, _T_DIM_ORDER = 0, 2, 3


def program_external_tensors(parsed: ParsedFile) -> list[tuple[str, TensorInfo]]:
    """``(key, info)`` for every EXTERNAL tensor value of a .pte's execution plans."""
    out: list[tuple[str, TensorInfo]] = []
    for method, i, t in tensor_values(program_root(parsed)):
        fqn = external_name(t)
        if fqn is None:
            continue
        sizes = read_dims(t.vector(_T_SIZES, "sizes", 4))
        order = t.vector(_T_DIM_ORDER, "dim_order", 1)
        out.append(
            (
                fqn,
                scalar_type_info(
                    t.scalar(_T_SCALAR_TYPE, "scalar_type", "i8"),
                    sizes,
                    tuple(order.u8s()) if order else (),
                    "program",
                    f"{method} values[{i}]",
                ),
            )
        )
    return out


def xnnpack_tensors(
    parsed: ParsedFile, loader: DataLoader, *, strict: bool = True
) -> list[tuple[str, TensorInfo]]:
    """``(key, info)`` for every named constant of every XNNPACK delegate blob of a .pte.

    Each distinct graph is read once, and only its blob's header and XNNGraph
    FlatBuffer; all of them together do work bounded by the file's size. ``strict``
    as for :func:`~.sizes.xnnpack_graphs` (False: a run's checks).
    """
    out: list[tuple[str, TensorInfo]] = []
    budget = file_budget(parsed)
    for graph, src, where in xnnpack_graphs(parsed, loader, budget, strict=strict):
        out += [(k.key, k.info) for k in parse_xnngraph(graph, src, where, budget)]
    return out


def xnnpack_packed_weights(parsed: ParsedFile, loader: DataLoader) -> list[PackedWeight]:
    """Every weight the XNNPACK delegate blobs of a .pte have XNNPACK pack at load time
    (:func:`~ptestore.format.xnnpack.parse_packed_weights`), each distinct graph read
    once (work bounded as for :func:`xnnpack_tensors`)."""
    out: list[PackedWeight] = []
    budget = file_budget(parsed)
    for graph, src, where in xnnpack_graphs(parsed, loader, budget):
        out += parse_packed_weights(graph, src, where, budget)
    return out


class TensorIndex(Mapping[str, TensorInfo]):
    """Key -> TensorInfo for every key some description names (also keys that are
    missing from the files, e.g. an EXTERNAL tensor whose .ptd was not given)."""

    def __init__(self, described: list[tuple[str, TensorInfo]]) -> None:
        # Linear in the descriptions: each is looked up by what it says (a set per key).
        found: dict[str, tuple[list[TensorInfo], set[tuple[object, ...]], list[int]]] = {}
        for key, info in described:
            infos, seen, more = found.setdefault(key, ([], set(), [0]))
            said = info.description()
            if said in seen:
                continue
            seen.add(said)
            if len(infos) <= MAX_OTHER_USES:
                infos.append(info)
            else:
                more[0] += 1
        self._infos = {
            key: (
                infos[0]
                if len(infos) == 1
                else replace(infos[0], other_uses=tuple(infos[1:]), more_uses=more[0])
            )
            for key, (infos, _, more) in found.items()
        }

    def __getitem__(self, key: str) -> TensorInfo:
        return self._infos[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


def describe_tensors(
    pte: ParsedFile, pte_loader: DataLoader, ptd: ParsedFile | None = None
) -> TensorIndex:
    """Every description of every named-data key of a model (.pte + optional .ptd)."""
    described = xnnpack_tensors(pte, pte_loader)
    described += program_external_tensors(pte)
    for parsed in (ptd, pte):
        if parsed is not None:
            described += layout_tensors(parsed)
    return TensorIndex(described)


def read_tensors(
    pte: ParsedFile, pte_loader: DataLoader, *, strict: bool = True
) -> list[tuple[str, TensorInfo]]:
    """``(key, info)`` for every named-data value a .pte reads: its XNNPACK graphs'
    constants and its EXTERNAL tensors (reads only the graphs' FlatBuffers). ``strict``
    as for :func:`xnnpack_tensors`."""
    return xnnpack_tensors(pte, pte_loader, strict=strict) + program_external_tensors(pte)


def unheld_keys(
    pte: ParsedFile,
    pte_loader: DataLoader,
    ptd: ParsedFile | None = None,
    described: list[tuple[str, TensorInfo]] | None = None,
) -> list[tuple[str, TensorInfo]]:
    """``(key, info)`` for every key the .pte's XNNPACK graphs or EXTERNAL tensors read
    from named data that neither the .pte nor the ``ptd`` given holds, each key once, in
    the order found: the runtime cannot load such a pair (a key it does not find is error
    0x20). Without ``ptd``: the keys the .pte expects from its .ptd. ``described``: what
    :func:`read_tensors` returned for the .pte, when the caller has it."""
    files = (pte,) if ptd is None else (pte, ptd)
    held = {e.key for parsed in files for e in parsed.container.named_data}
    out: dict[str, TensorInfo] = {}
    for key, info in read_tensors(pte, pte_loader) if described is None else described:
        if key not in held:
            out.setdefault(key, info)
    return list(out.items())


def short_values(
    pte: ParsedFile, ptd: ParsedFile | None, described: list[tuple[str, TensorInfo]]
) -> list[tuple[str, ParsedFile, int, TensorInfo]]:
    """``(key, file, stored size, info)`` for every held value shorter than the largest
    description of its key in ``described`` (the value the runtime reads: the .ptd's
    when both files hold the key), in the order found. The runtime reads as many bytes
    as the description says from the value's start, past its end (into whatever
    follows, or out of the file: a crash). A longer value is fine (its tail is unread)."""
    holders: dict[str, tuple[ParsedFile, int]] = {}
    for parsed in (ptd, pte):
        if parsed is not None:
            for e in parsed.container.named_data:
                holders.setdefault(e.key, (parsed, e.segment_index))
    largest: dict[str, TensorInfo] = {}
    for key, info in described:
        best = largest.get(key)
        if key in holders and (best is None or info.nbytes > best.nbytes):
            largest[key] = info
    out = []
    for key, info in largest.items():
        parsed, index = holders[key]
        size = parsed.container.segments[index].size
        if size < info.nbytes:
            out.append((key, parsed, size, info))
    return out


def layout_tensors(parsed: ParsedFile) -> list[tuple[str, TensorInfo]]:
    """``(key, info)`` for every named-data entry that carries a tensor layout (.ptd)."""
    src = parsed.container.source
    return [
        (e.key, info_from_layout(e.tensor_layout, f"{src} named_data {e.key!r}"))
        for e in parsed.container.named_data
        if e.tensor_layout is not None
    ]


def tensor_index_of(parsed: ParsedFile, loader: DataLoader) -> TensorIndex:
    """The tensor index of one file on its own: a .pte's XNNPACK graphs and EXTERNAL
    tensors, or a .ptd's layouts."""
    if parsed.container.kind == "pte":
        return describe_tensors(parsed, loader)
    return TensorIndex(layout_tensors(parsed))


def named_data_json(
    parsed: ParsedFile, loader: DataLoader, index: TensorIndex | None = None
) -> list[dict[str, object]]:
    """``named_data`` rows for ``inspect --json``: key, segment index, size in bytes and
    ``tensor_info`` (``TensorInfo.to_json()`` or None). Reads only the XNNPACK graphs."""
    c = parsed.container
    if index is None:
        index = tensor_index_of(parsed, loader)
    rows: list[dict[str, object]] = []
    for e in c.named_data:
        info = index.get(e.key)
        rows.append(
            {
                "key": e.key,
                "segment_index": e.segment_index,
                "size": c.segments[e.segment_index].size,
                "tensor_info": None if info is None else info.to_json(),
            }
        )
    return rows
