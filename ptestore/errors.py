"""One exception hierarchy for everything ptestore raises on purpose.

Every error is a :class:`PteStoreError`. Categories subclass the matching builtin
where one exists, so callers can catch either (``except FileExistsError`` catches
:class:`AlreadyExists`, ``except ValueError`` catches :class:`FormatError`).

Messages name the file (or URL), the field, the value and the limit, so a log line is
enough to understand what went wrong without a debugger.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "AlreadySpecialized",
    "BackendError",
    "ConfigurationError",
    "FormatError",
    "IntegrityError",
    "InvalidReplacement",
    "LockTimeout",
    "MissingNamedData",
    "ModelRetired",
    "NothingSpecialized",
    "PackedWeightsRefused",
    "NotSupported",
    "ObjectNotFound",
    "PreconditionFailed",
    "PartialPublish",
    "PermissionDenied",
    "PteStoreError",
    "PublishUncertain",
    "StorageError",
    "WriterStateError",
    "describe_exception",
]


class PteStoreError(Exception):
    """Base class of every error ptestore raises deliberately. Its ``str()`` and ``repr()``
    show every URL in it redacted (:func:`~ptestore.storage.types.redact_urls`: no password
    nor presigned signature, a library's error quoted too); ``args`` and attributes as given."""

    def __str__(self) -> str:
        from ._redact import redact_urls  # here: ``import ptestore`` loads errors.py alone

        return redact_urls(super().__str__())

    def __repr__(self) -> str:  # Dask logs ``repr(e)``, a worker ``%r``
        from ._redact import redacted_repr

        return redacted_repr(self)


def _given(exc: BaseException) -> str:
    """The message ``exc`` was made with (a pickled error's: its ``str()`` is redacted)."""
    return str(exc.args[0]) if exc.args else ""


class FormatError(PteStoreError, ValueError):
    """A .pte or .ptd container is malformed, truncated or hostile.

    Attributes
    ----------
    source:
        The file or URL the bytes came from (``"<bytes>"`` when unknown).
    field:
        The header or FlatBuffer field that is wrong, e.g. ``"Program.segments[3].offset"``.
    value:
        The offending value (the message shows it cut to about 80 characters,
        :func:`shown`).
    limit:
        What the value must satisfy, in words (e.g. ``"<= 6048 (file size)"``).
    """

    def __init__(
        self,
        source: str,
        field: str,
        value: object,
        limit: str,
        detail: str | None = None,
    ) -> None:
        self.source = source
        self.field = field
        self.value = value
        self.limit = limit
        self.detail = detail
        from ._text import shown  # here: ``import ptestore`` loads errors.py alone

        msg = f"{source}: {field} = {shown(value)}: must be {limit}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.source, self.field, self.value, self.limit, self.detail))


class ConfigurationError(PteStoreError, ValueError):
    """Bad arguments: an unknown URL scheme, an unknown backend, a bad option."""


class MissingNamedData(ConfigurationError, KeyError):
    """A named-data key the model's files do not hold (typically: a ``.pte`` whose
    weights are in a ``.ptd`` that was not given). A ``KeyError`` too, as the
    named-data map's protocol says; its message names the key and the files looked in.

    Attributes
    ----------
    key:
        The key asked for.
    files:
        The files looked in (the ``.pte``, and the ``.ptd`` when there is one).
    """

    def __init__(self, message: str, *, key: str = "", files: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.key = key
        self.files = files

    def __str__(self) -> str:  # not KeyError's repr of its argument
        from ._redact import redact_urls

        return redact_urls(str(self.args[0])) if self.args else ""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_missing, (_given(self), self.key, self.files))


def _rebuild_missing(message: str, key: str, files: tuple[str, ...]) -> MissingNamedData:
    return MissingNamedData(message, key=key, files=files)


class NothingSpecialized(ConfigurationError):
    """A run with ``strict=True`` found nothing to specialize: no backend id of the
    program has an implementation, every backend declined, or the backends given serve
    no id of the program. Nothing was published.

    Attributes
    ----------
    backend_ids:
        The ``BackendDelegate.id`` values of the program.
    installed:
        The installed backends, as ``"name (spec)"`` strings.
    hint:
        What to do about it, when something specific is known (e.g. pass ``--ptd``).
    """

    def __init__(
        self,
        message: str,
        *,
        backend_ids: tuple[str, ...] = (),
        installed: tuple[str, ...] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.backend_ids = backend_ids
        self.installed = installed
        self.hint = hint

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_nothing, (_given(self), self.backend_ids, self.installed, self.hint))


class ModelRetired(ConfigurationError):
    """A job index's entries of the model asked for are all retired (the job no longer
    names it: ``fleet retire``): nothing is selected for any device, not even the
    portable source. ``ensure(index, ...)`` records this answer in the entry it fetched
    before, which is then never served offline either."""


class AlreadySpecialized(ConfigurationError):
    """An in-place run was asked to specialize a file that is already a specialized
    output (its provenance trailer, or the cache's record, says so): specializing it
    again would apply the backends twice. The portable source is needed (``ensure(...,
    portable=PATH)``, ``ptestore ensure --portable PATH``). Nothing was changed.

    Attributes
    ----------
    path:
        The file.
    provenance:
        Its provenance record (a :class:`~ptestore.provenance.record.Provenance`), or
        None when the cache's record is what says so.
    """

    def __init__(self, message: str, *, path: str = "", provenance: object = None) -> None:
        super().__init__(message)
        self.path = path
        self.provenance = provenance

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_already, (_given(self), self.path, self.provenance))


def _rebuild_already(message: str, path: str, provenance: object) -> AlreadySpecialized:
    return AlreadySpecialized(message, path=path, provenance=provenance)


def _rebuild_nothing(
    message: str, backend_ids: tuple[str, ...], installed: tuple[str, ...], hint: str | None
) -> NothingSpecialized:
    return NothingSpecialized(message, backend_ids=backend_ids, installed=installed, hint=hint)


class StorageError(PteStoreError, OSError):
    """Reading or writing storage failed (after any retries).

    ``errno`` is the system's error number when one caused it (``errno.ENOSPC`` for a
    full disk, also when ptestore refuses before writing because the free space is too
    small), else None, so an application can branch on it as on any ``OSError``.
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno

    def __reduce__(self) -> tuple[object, ...]:
        # OSError keeps errno outside __dict__: carry it (errors cross processes).
        return (type(self), self.args, {**self.__dict__, "errno": self.errno})


class ObjectNotFound(StorageError, FileNotFoundError):
    """The object or file to read does not exist."""


class PermissionDenied(StorageError, PermissionError):
    """The storage refused the credentials or the access (HTTP 401/403, EACCES/EPERM).

    Not transient: retrying with the same credentials gives the same answer."""


class AlreadyExists(StorageError, FileExistsError):
    """``publish(mode="create")`` found an object already at the destination."""


class PreconditionFailed(StorageError):
    """A condition did not hold: the storage refused a conditional request (HTTP 412,
    409 ``ConditionalRequestConflict``), or ptestore's own check found the object
    changed.

    ``publish(mode="if-match", expected=V)`` raises it when the destination is no longer
    version ``V``: nothing was published; read the object again, redo the change and
    retry (:func:`ptestore.writers.versions.read_versioned`).

    Attributes
    ----------
    url:
        The object whose condition failed (None when not known).
    expected:
        The version the caller expected (None when not known).
    found:
        The version found instead, or None when the object does not exist or its
        version is not known (the message says which).
    refused_by:
        ``"storage"`` when the storage service refused the request (its 412 or 409),
        ``"ptestore"`` when ptestore's own check did (a local or memory compare-and-swap,
        the S3 writer's check of its copy sources before Complete).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        refused_by: str = "storage",
    ) -> None:
        super().__init__(message)
        self.url = url
        self.expected = expected
        self.found = found
        self.refused_by = refused_by


class PublishUncertain(StorageError):
    """Publishing may or may not have taken effect (e.g. a lost response that could
    not be reconciled). The destination holds either the old or the new object."""


class LockTimeout(StorageError, TimeoutError):
    """A cache lock was not free within the time allowed (``ensure(lock_timeout=...)``,
    ``ptestore ensure --lock-timeout``); ``path`` is the lock file, ``holder`` the pid
    of a process holding it when the system says (Linux: ``/proc/locks``), else None."""

    def __init__(self, message: str, *, path: str = "", holder: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class WriterStateError(PteStoreError, RuntimeError):
    """A writer was used outside its life cycle (write after publish, second publish,
    use after discard)."""


class NotSupported(PteStoreError, NotImplementedError):
    """Raised by :meth:`BackendInterface.initialize_backend_data` to mean
    "leave this backend's data as it is"."""


class BackendError(PteStoreError):
    """A backend failed or misbehaved during specialization.

    Attributes name the backend (``backend``: the ``BackendDelegate.id`` during a run,
    else the SPEC; ``spec``: the implementation's spec when both are known), and where
    known the method and named-data key. Messages name it one way everywhere:
    ``backend 'ID' (SPEC)``, or ``backend 'SPEC'`` before any id is known.
    """

    def __init__(
        self,
        message: str,
        *,
        backend: str | None = None,
        method: str | None = None,
        key: str | None = None,
        spec: str | None = None,
    ) -> None:
        self.backend = backend
        self.method = method
        self.key = key
        self.spec = spec
        where = []
        if backend is not None:
            both = spec is not None and spec != backend
            where.append(f"backend {backend!r}" + (f" ({spec})" if both else ""))
        if method is not None:
            where.append(f"method {method!r}")
        if key is not None:
            where.append(f"key {key!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.message = message

    def name_backend(
        self, backend: str, spec: str | None, method: str | None, key: str | None
    ) -> None:
        """Say whose error this is where it does not yet (raised by a backend's own code,
        ``raise BackendError("vendor compiler failed")``): the backend it came from and,
        where the error names none, the method and key it was working on. An error that
        names the backend by its id alone gets its spec."""
        if self.backend is None:
            BackendError.__init__(
                self,
                self.message,
                backend=backend,
                method=self.method if self.method is not None else method,
                key=self.key if self.key is not None else key,
                spec=spec,
            )
        elif self.backend == backend and self.spec is None and spec is not None:
            BackendError.__init__(
                self, self.message, backend=backend, method=self.method, key=self.key, spec=spec
            )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_backend_error,
            (type(self), self.message, self.backend, self.method, self.key, self.spec),
        )


def _rebuild_backend_error(
    cls: type[BackendError],
    message: str,
    backend: str | None,
    method: str | None,
    key: str | None,
    spec: str | None = None,
) -> BackendError:
    return cls(message, backend=backend, method=method, key=key, spec=spec)


class InvalidReplacement(BackendError, ValueError):
    """A backend submitted a replacement that breaks the rules (unknown key, key written
    twice, bad alignment, inconsistent aliases)."""


class IntegrityError(StorageError):
    """Bytes do not match what they must be (size or checksum differs).

    Raised after publishing, when the end-to-end check finds the storage holds other
    bytes than the writer sent; and by ``fetch`` before publishing, when a download does
    not match its index (``published=False``: nothing was published)."""

    def __init__(self, message: str, *, published: bool = True) -> None:
        super().__init__(message)
        #: Whether a publish had taken effect when the mismatch was found.
        self.published = published


class PartialPublish(StorageError):
    """Of a .pte/.ptd pair, one file was published and the other was not (see
    docs/concepts.md: rerun from the original sources); or, from ``fetch
    --xnnpack-cache``, the pair was and its packed-weight file was not (``published``
    names what was)."""

    def __init__(self, message: str, *, published: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.published = published

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_partial, (_given(self), self.published))


def _rebuild_partial(message: str, published: tuple[str, ...]) -> PartialPublish:
    return PartialPublish(message, published=published)


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` for any exception, even one whose ``__str__`` raises or
    returns something other than a string (backend code is user code)."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException as inner:  # a hostile __str__ must not escape
        if isinstance(inner, KeyboardInterrupt):
            raise
        return f"{name} (its message could not be read: {type(inner).__name__})"
    return f"{name}: {text}" if text else name


class PackedWeightsRefused(PteStoreError):
    """ptestore.xnnpack refused to make an XNNPACK packed-weight file for an artifact: the
    runtime crashed or failed with the cache on, outputs differed from a load without it,
    or the graph cannot be cached. The artifact itself is still usable without one.
    ``transient``: a failure that may pass (the runtime timed out, was killed, died of
    SIGBUS under a mapped file such as on a full disk, or exited without saying why): not
    remembered, the next call tries again."""

    def __init__(self, artifact: str, reason: str, *, transient: bool = False) -> None:
        super().__init__(
            f"{artifact}: no XNNPACK packed-weight file: {reason} "
            "(the artifact still loads without one)"
        )
        self.artifact = artifact
        self.reason = reason
        self.transient = transient

    def __reduce__(self) -> tuple[object, ...]:
        return (_refused, (self.artifact, self.reason, self.transient))


def _refused(artifact: str, reason: str, transient: bool) -> PackedWeightsRefused:
    return PackedWeightsRefused(artifact, reason, transient=transient)
