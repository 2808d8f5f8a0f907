"""The ExecuTorch container formats: .pte (Program) and .ptd (FlatTensor).

Parsing is pure (no I/O) and paranoid: every offset is validated before use and every
malformed input raises :class:`~ptestore.errors.FormatError`.
"""

from __future__ import annotations

from .model import (
    MAX_INFERRED_ALIGNMENT,
    CompileSpec,
    Container,
    Delegate,
    NamedDataEntry,
    PtdHeader,
    PteHeader,
    Segment,
    SubsegmentOffsets,
    TensorLayout,
    inferred_alignment,
)
from .parse import HEAD_BYTES, detect_kind, metadata_size, parse, parse_ptd, parse_pte
from .patch import PatchResult, align_up, patch_metadata
from .reader import ParsedFile, read_container

__all__ = [
    "HEAD_BYTES",
    "MAX_INFERRED_ALIGNMENT",
    "CompileSpec",
    "Container",
    "Delegate",
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
    "metadata_size",
    "parse",
    "parse_ptd",
    "parse_pte",
    "patch_metadata",
    "read_container",
]
