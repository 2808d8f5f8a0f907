"""What a backend submits as bytes (``BackendData.data``, a chunk of
``write_named_data_chunks``), as the session (:mod:`.session`) reads it.

- :func:`byte_view`: the bytes of a buffer as one flat ``"B"`` view, and the element
  format the buffer declares (PEP 3118: ``"f"`` float32, ``"d"`` float64, ``"O"`` an
  object pointer, ...);
- :func:`holds_pointers`: whether that format holds Python object pointers (a numpy
  array of ``dtype=object``): its bytes are addresses in this process, never data, so
  such a buffer is refused wherever it is submitted;
- :func:`declared_dtype`: the dtype a value says it holds (a numpy array's dtype, or a
  typed buffer's format as numpy names it: a ``memoryview`` of float64 values for a
  float32 key), which the session compares with the key's tensor info.
"""

from __future__ import annotations

import re

__all__ = ["byte_view", "declared_dtype", "holds_pointers", "pointers_refused"]

#: PEP 3118 formats of one name whatever the platform (the integer codes whose size
#: varies, ``i l q n`` and their unsigned forms, are named by their item size).
_FIXED = {"?": "bool", "e": "float16", "f": "float32", "d": "float64", "b": "int8"}
_FIXED.update({"h": "int16", "H": "uint16"})
#: Formats of raw bytes: nothing to compare.
_RAW = ("B", "c", "x", "s", "p")


def byte_view(data: object) -> tuple[memoryview | None, str | None]:
    """``(flat bytes view, element format)`` of ``data``: the view None when ``data``
    is not a C-contiguous buffer, the format None when it is not a buffer at all."""
    try:
        typed = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        return None, None
    try:
        return typed.cast("B"), typed.format
    except TypeError:  # not C-contiguous
        return None, typed.format


def holds_pointers(fmt: str | None) -> bool:
    """Whether a buffer of format ``fmt`` holds object pointers (``"O"``, alone or as a
    field of a struct format; the field names between colons are not looked at)."""
    return fmt is not None and "O" in re.sub(r":[^:]*:", "", fmt)


def pointers_refused(what: str, which: str, fmt: str | None) -> str:
    """The message refusing a buffer of object pointers (``which``: ``"BackendData.data"``
    or ``"a chunk"``)."""
    return (
        f"{what}: {which} is a buffer of Python object pointers (format {fmt!r}: a numpy "
        "array of dtype object?): its bytes are memory addresses of this process, not "
        "data; convert the values to a numeric dtype (numpy.asarray(values, "
        "dtype=numpy.float32)) or pass bytes"
    )


def declared_dtype(value: object, fmt: str | None) -> tuple[str, str] | None:
    """``(dtype, what value is, in words)`` for a value that says what it holds: a numpy
    array (its dtype), or a typed buffer (its format ``fmt`` as numpy names it: ``"d"``
    is float64); None for raw bytes (``bytes``, a ``"B"`` view) or a format without
    one name (a struct, a complex number)."""
    if type(value).__module__ == "numpy":
        dtype = getattr(value, "dtype", None)
        return None if dtype is None else (str(dtype), f"a numpy array of dtype {dtype}")
    if fmt is None:
        return None
    code = fmt.lstrip("@=<>!")
    big = fmt[:1] in (">", "!") and code not in ("b", "B", "?", "c")
    if len(code) != 1 or code in _RAW:
        return None
    name = _FIXED.get(code)
    if name is None and code in "ilqnILQN":
        size = memoryview(value).itemsize  # type: ignore[arg-type]
        name = f"{'u' if code.isupper() else ''}int{8 * size}"
    if name is None:
        return None
    name = f"{name} (big-endian)" if big else name
    return name, f"a buffer of format {fmt!r} ({name})"
