"""What the backend kit (:mod:`.backend_contract`) keeps of each run and says when one
fails: the :class:`Outcome` of a run, its files without the provenance trailer, the
reason a backend gave for declining, and a failure described with the backend's own
traceback (its file and line, not the kit's)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..provenance.trailer import read_trailer
from ..storage.loaders import BytesLoader
from .named_data import NamedData

if TYPE_CHECKING:
    from ..backends.api import BackendInterface
    from ..coordinator.report import SpecializationReport

__all__ = [
    "FLOAT_DTYPES",
    "Outcome",
    "all_finite",
    "allow_unchanged",
    "content",
    "describe_failure",
    "named_outputs",
    "read_optional",
    "said_why",
]


@dataclass
class Outcome:
    """One specialization run of the contract."""

    report: SpecializationReport | None = None
    error: BaseException | None = None
    pte: bytes = b""
    ptd: bytes | None = None
    #: backend id -> why it declined
    declined: dict[str, str] = field(default_factory=dict)
    #: The instance the run used (its version is read again after the run).
    backend: BackendInterface | None = field(default=None, compare=False, repr=False)

    def content(self) -> tuple[bytes, bytes | None]:
        """The files without ptestore's provenance trailer (whose time stamp differs)."""
        return content(self.pte), None if self.ptd is None else content(self.ptd)


def content(data: bytes) -> bytes:
    """``data`` without its provenance trailer."""
    trailer = read_trailer(BytesLoader(data))
    return data if trailer is None else data[: trailer.content_size]


def named_outputs(pte: bytes, ptd: bytes | None) -> NamedData:
    """The named data of an output (a ``.pte`` and its ``.ptd``, if any)."""
    loaders = [BytesLoader(pte, "<output .pte>")]
    if ptd is not None:
        loaders.append(BytesLoader(ptd, "<output .ptd>"))
    return NamedData(list(loaders))


#: The dtypes whose values the kit requires to stay finite.
FLOAT_DTYPES = ("float32", "float16", "float64", "bfloat16")


def all_finite(values: Any, dtype: str) -> bool:
    """Whether every value of a named-data array (``get_array``) is finite. A
    ``bfloat16`` value comes as its ``uint16`` bit pattern, which ``numpy.isfinite``
    always calls finite: its exponent bits (all ones: an infinity or a nan) decide."""
    import numpy as np

    if dtype == "bfloat16":
        return not bool(((np.asarray(values, dtype=np.uint16) & 0x7F80) == 0x7F80).any())
    return bool(np.isfinite(values).all())


def read_optional(path: os.PathLike[str] | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


#: How ptestore reports a backend that returned without writing anything (not a reason
#: the backend gave).
_SILENT = "returned without writing anything ("


def said_why(reason: str | None) -> str:
    """The reason a backend gave for declining ("" when it gave none: ptestore's own
    note that it wrote nothing is not the backend saying why)."""
    return "" if not reason or reason.startswith(_SILENT) else reason


def allow_unchanged() -> dict[str, Any]:
    """Publish an unchanged copy when the backend declines (the contract looks at it)."""
    return {"allow_unchanged": True}


_PTESTORE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def describe_failure(error: BaseException) -> str:
    """``Type: message``, then where the backend's own code is: the traceback of the
    exception it raised (the error's ``__cause__`` chain), or, for an error ptestore
    raised in a call the backend made (a refused write), the backend's frames that
    made it. A failed check showed only ptestore's message: the author did not see
    their file and line."""
    import traceback

    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__
    if cause is not None:
        shown = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        return f"{text}\n\nThe backend's exception:\n{shown.rstrip()}"
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not os.path.abspath(f.filename).startswith(_PTESTORE)
    ]
    if not frames:
        return text
    shown = "".join(traceback.format_list(frames))
    return f"{text}\n\nWhere the backend made the call:\n{shown.rstrip()}"
