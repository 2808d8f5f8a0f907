"""Per-pair retries: a pair whose failure is transient (the storage gave up after its
own retries: a connection lost, throttling, a publish whose outcome was uncertain, a
second file that failed after the first was published) is run again from its sources,
up to :data:`PAIR_ATTEMPTS` times in all. Bad input, missing objects, refused access,
integrity failures and backend errors are final."""

from __future__ import annotations

from ..errors import (
    AlreadyExists,
    IntegrityError,
    ObjectNotFound,
    PermissionDenied,
    PteStoreError,
    StorageError,
)

__all__ = ["PAIR_ATTEMPTS", "backoff", "transient"]

#: Attempts per pair, the first included.
PAIR_ATTEMPTS = 3


def transient(exc: BaseException) -> bool:
    """Whether running the pair again may succeed."""
    if isinstance(exc, (ObjectNotFound, PermissionDenied, AlreadyExists, IntegrityError)):
        return False
    if isinstance(exc, StorageError):
        return True
    if isinstance(exc, PteStoreError):
        return False
    from .._retry.categories import Category, classify

    return classify(exc) is Category.TRANSIENT


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    return min(2.0, 0.1 * float(2 ** (attempt - 1)))
