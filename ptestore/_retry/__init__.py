"""One classification of storage failures, one retry policy, one mapping to ptestore errors.

Every loader and writer asks this module three questions about a failure:

- :func:`classify`: which :class:`Category` is it? Decided by the error *code* and
  HTTP *status* of a botocore ``ClientError`` (or anything carrying the same
  ``response`` dict), by the ``errno`` of an ``OSError`` and by the exception *type*
  (connection and timeout errors of the standard library, botocore, urllib3 and
  aiohttp). Never by the text of a message: ``OSError("short read: wanted 5000
  bytes")`` is not a server error because it contains "500".
- :class:`RetryPolicy`: retry the :attr:`Category.TRANSIENT` ones, with jittered
  exponential backoff (tenacity), logging each retry on ``ptestore.retry``.
- :func:`to_storage_error`: the :mod:`ptestore.errors` exception to raise (missing ->
  :class:`~ptestore.errors.ObjectNotFound`, 401/403/EACCES ->
  :class:`~ptestore.errors.PermissionDenied`, 412 ->
  :class:`~ptestore.errors.PreconditionFailed`, ...).

Modules: :mod:`.categories` (the code, status, type and errno tables, :func:`classify`,
:func:`to_storage_error`) and :mod:`.policy` (:class:`RetryPolicy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .categories import (
        Category,
        ErrorInfo,
        classify,
        error_code,
        error_info,
        is_conflict,
        is_transient,
        to_storage_error,
    )
    from .policy import CONFLICT_RETRY, DEFAULT_RETRY, RETRY_OPTIONS, RetryPolicy


__all__ = [
    "CONFLICT_RETRY",
    "DEFAULT_RETRY",
    "RETRY_OPTIONS",
    "Category",
    "ErrorInfo",
    "RetryPolicy",
    "classify",
    "error_code",
    "error_info",
    "is_conflict",
    "is_transient",
    "to_storage_error",
]

#: Every public name imported on first use (PEP 562): importing the package takes
#: none of its submodules' import locks, so two threads' first imports of the
#: package and of one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    "Category": "categories",
    "ErrorInfo": "categories",
    "classify": "categories",
    "error_code": "categories",
    "error_info": "categories",
    "is_conflict": "categories",
    "is_transient": "categories",
    "to_storage_error": "categories",
    "CONFLICT_RETRY": "policy",
    "DEFAULT_RETRY": "policy",
    "RETRY_OPTIONS": "policy",
    "RetryPolicy": "policy",
}

__getattr__ = lazy_names(__name__, _LAZY)
