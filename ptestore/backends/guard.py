"""A backend's code called outside its run, guarded as the run guards
``initialize_backend_data`` (:mod:`ptestore.coordinator.calls`): whatever it raises,
``SystemExit`` (a ``sys.exit()`` in it or in a library it calls) and any other
``BaseException`` included, is a :class:`~ptestore.errors.BackendError` naming the
backend and the method (``backend 'SPEC': check_compatibility failed: SystemExit: 0``);
only ``KeyboardInterrupt`` goes through as itself. A ``BackendError`` of its own is named
where it names no backend; a ``StorageError`` (a file it read) stays what it is.

Used for ``check_compatibility`` (:mod:`.rating`), ``compatibility_info`` (the
provenance stamp) and reading ``version`` (:mod:`.versions`); before, each caught
``Exception`` only, so a ``sys.exit(0)`` in ``check_compatibility`` ended ``ptestore
verify`` and ``ptestore select`` with status 0 and no output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import BackendError, StorageError, describe_exception

__all__ = ["guarded"]

T = TypeVar("T")


def guarded(backend: str, what: str, call: Callable[..., T], *args: object) -> T:
    """``call(*args)``, backend code: its failure a :class:`BackendError` naming
    ``backend`` (its id or SPEC) and ``what`` (``"check_compatibility"``, ``"reading its
    version"``): ``"<what> failed: <Type>: <message>"``."""
    try:
        return call(*args)
    except KeyboardInterrupt:
        raise
    except BackendError as exc:  # raised by the backend's own code: say whose it is
        exc.name_backend(backend, None, None, None)
        raise
    except StorageError:  # a file it read failed: not the backend's failure
        raise
    except BaseException as exc:  # backend code is user code, SystemExit included
        raise BackendError(f"{what} failed: {describe_exception(exc)}", backend=backend) from exc
