"""CRC-32 arithmetic for S3's full-object checksums.

S3 checks a multipart object against one CRC-32 of all its bytes
(``ChecksumType=FULL_OBJECT``). The writer knows each part's CRC-32 when it uploads it;
:func:`crc32_combine` joins them without reading the bytes again (zlib's algorithm:
shifting a CRC over ``n`` zero bytes is a multiplication by ``x^(8n)`` modulo the
polynomial, computed by repeated squaring).
"""

from __future__ import annotations

import base64

__all__ = ["b64crc", "crc32_combine"]

_POLY = 0xEDB88320  # reflected CRC-32 (zlib, S3 "CRC32")


def _multmodp(a: int, b: int) -> int:
    """Multiply two polynomials modulo the CRC-32 polynomial (reflected bit order)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial: the operator that shifts a CRC over n zero bytes."""
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


def b64crc(value: int) -> str:
    """A CRC-32 as S3 writes it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")
