"""The ExecuTorch container formats: .pte (Program) and .ptd (FlatTensor).

Parsing is pure (no I/O) and paranoid: every offset is validated before use and every
malformed input raises :class:`~ptestore.errors.FormatError`.

Modules: :mod:`.header` (header layouts, constants, alignment helpers), :mod:`.flatbuf`
(bounds-checked FlatBuffer reads), :mod:`.parsing` (metadata -> :class:`Container`),
:mod:`.model` (the container model), :mod:`.patch` (new segment placements -> new
metadata), :mod:`.reader` (ranged reads through a loader).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .header import (
        HEAD_BYTES,
        SEGMENT_BASE_ALIGNMENT,
        FileHead,
        PtdHeader,
        PteHeader,
        align_up,
        detect_kind,
        is_power_of_two,
    )
    from .model import (
        MAX_INFERRED_ALIGNMENT,
        CompileSpec,
        Container,
        Delegate,
        NamedDataEntry,
        Segment,
        SubsegmentOffsets,
        TensorLayout,
        inferred_alignment,
    )
    from .parsing import metadata_size, parse, parse_metadata, parse_ptd, parse_pte
    from .patch import PatchResult, metadata_growth_bound, patch_metadata
    from .reader import ParsedFile, read_container

#: Names imported on first use (PEP 562): the patcher and the reader are not needed by
#: what only uses the model (the backend API, an ``ensure`` cache hit); and importing the
#: package takes none of its submodules' import locks, so two threads' first imports of
#: the package and of one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    **dict.fromkeys(
        (
            "HEAD_BYTES",
            "SEGMENT_BASE_ALIGNMENT",
            "FileHead",
            "PtdHeader",
            "PteHeader",
            "align_up",
            "detect_kind",
            "is_power_of_two",
        ),
        "header",
    ),
    **dict.fromkeys(
        (
            "MAX_INFERRED_ALIGNMENT",
            "CompileSpec",
            "Container",
            "Delegate",
            "NamedDataEntry",
            "Segment",
            "SubsegmentOffsets",
            "TensorLayout",
            "inferred_alignment",
        ),
        "model",
    ),
    **dict.fromkeys(
        ("metadata_size", "parse", "parse_metadata", "parse_ptd", "parse_pte"), "parsing"
    ),
    "PatchResult": "patch",
    "metadata_growth_bound": "patch",
    "patch_metadata": "patch",
    "ParsedFile": "reader",
    "read_container": "reader",
}

__all__ = [
    "HEAD_BYTES",
    "MAX_INFERRED_ALIGNMENT",
    "SEGMENT_BASE_ALIGNMENT",
    "CompileSpec",
    "Container",
    "Delegate",
    "FileHead",
    "NamedDataEntry",
    "ParsedFile",
    "PatchResult",
    "PtdHeader",
    "PteHeader",
    "Segment",
    "SubsegmentOffsets",
    "TensorLayout",
    "align_up",
    "detect_kind",
    "inferred_alignment",
    "is_power_of_two",
    "metadata_growth_bound",
    "metadata_size",
    "parse",
    "parse_metadata",
    "parse_ptd",
    "parse_pte",
    "patch_metadata",
    "read_container",
]


__getattr__ = lazy_names(__name__, _LAZY)
