"""Making provenance during a run: describe the sources, remember which backend served
which id (and its compatibility string), write a trailer after each output's last
segment, and the S3 object metadata that mirrors the key.

The pipeline uses one :class:`Stamper` per run; nothing here imports the coordinator.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from .._background import Background
from .._dataclass import dataclass, field
from ..backends.guard import guarded
from ..backends.registry import SPEC_ATTRIBUTE, BackendLike, load_backend
from ..backends.versions import MAX_SPEC, unrecordable, version_of
from ..errors import BackendError, ConfigurationError, StorageError
from ..storage.types import DataLoader, redacted_url
from .record import (
    BackendStamp,
    ContentDigest,
    DeviceStamp,
    JobStamp,
    Provenance,
    ProvenanceKey,
    RequestedBackend,
    SourceInfo,
)
from .trailer import encode_trailer

if TYPE_CHECKING:
    from ..backends.api import BackendDataInitContext, BackendInterface
    from ..backends.compat import DeviceProfile
    from ..writers.base import DataWriter

__all__ = [
    "MAX_COMPATIBILITY_INFO",
    "METADATA_PREFIX",
    "ProvenanceRequest",
    "Stamper",
    "describe_source",
    "object_metadata",
    "recordable",
    "spec_text",
]

#: Prefix of the S3 user-metadata keys (``x-amz-meta-ptestore-*``).
METADATA_PREFIX = "ptestore-"


#: The longest ``compatibility_info`` string a backend may return (UTF-8 bytes).
MAX_COMPATIBILITY_INFO = 64 * 1024


def recordable(text: str) -> str:
    """``text`` as provenance can record it: a path with bytes that are not UTF-8
    (decoded by Python as lone surrogates) gets them as ``\\xNN`` escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def describe_source(
    loader: DataLoader,
    url: str | None = None,
    *,
    cancelled: threading.Event | None = None,
    like: str | None = None,
    trust_trailer: bool = True,
) -> SourceInfo:
    """Size and digest of the whole object, with its entity tag and version id when the
    loader knows them. The digest is the root of its chunk digests (``sha256-tree:``,
    :func:`~.known.describe_content`: the chunks its own trailer or this process already
    names are not read); ``like`` a whole-file SHA-256 (``sha256:``, what records of
    versions 1 and 2 name): that, from one streaming read (into one reused buffer where
    the loader reads into memory it is given). ``cancelled``: stop early (raising
    :class:`~ptestore._background.Cancelled`) once it is set. ``trust_trailer=False``:
    the digest of every byte as read now, never taken from the object's own trailer nor
    from what this process described before (``verify --source``). The URL recorded is
    ``url`` (default: the loader's name) as :func:`~ptestore.storage.types.redacted_url`
    shows it: a password or a presigned query's signature is never recorded."""
    size = loader.size()
    if like is not None and like.startswith("sha256:"):
        import hashlib

        from .._io import HASH_PIECE, read_pieces

        h = hashlib.sha256()
        # a small buffer (the kernel's copy and the hash stay in the core's cache), and
        # it may live beside a backend's own (the description runs while backends do)
        for piece in read_pieces(loader, 0, size, cancelled=cancelled, buffer_size=HASH_PIECE):
            h.update(piece)
        digest = "sha256:" + h.hexdigest()
        chunks = None
    else:
        from .known import describe_content

        chunks = describe_content(loader, size, cancelled=cancelled, trust_trailer=trust_trailer)
        digest = chunks.chunks.digest
    etag = getattr(loader, "etag", None)
    version = getattr(loader, "version_id", None)
    return SourceInfo(
        url=recordable(redacted_url(url or loader.name)),
        size=size,
        sha256=digest,
        etag=etag if isinstance(etag, str) else None,
        version_id=version if isinstance(version, str) else None,
        chunks=chunks,
    )


def _describe_cancellable(
    loader: DataLoader, like: str | None, cancelled: threading.Event
) -> SourceInfo:
    return describe_source(loader, cancelled=cancelled, like=like)


#: A local source at least this large is described in a thread of its own while the run
#: goes on (parse, backends, layout, the output's digest): on two cores or more its
#: SHA-256 then costs little extra time. Only local files: they read from any thread
#: (``pread``) and count no requests; anything else is described before the run goes on.
CONCURRENT_MIN = 32 << 20


def spec_text(backend: BackendLike) -> str:
    """How a backend given as a SPEC, a class or an instance is recorded."""
    if isinstance(backend, str):
        return backend.strip()
    cls = backend if isinstance(backend, type) else type(backend)
    return f"{cls.__module__}:{cls.__qualname__}"


def _check_spec(backend: BackendLike) -> None:
    """A SPEC string provenance cannot record (it is the user's input: a
    :class:`ConfigurationError`)."""
    if not isinstance(backend, str):
        return
    text = backend.strip()
    problem = unrecordable(text, "its SPEC is", MAX_SPEC, "provenance records it")
    if problem is not None:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ConfigurationError(f"backend {shown!r}: {problem}")


def _ptestore_version() -> str:
    from .._version import __version__

    return __version__


@dataclass
class ProvenanceRequest:
    """Ask a run for provenance. ``sources`` may carry already-known descriptions of the
    .pte (``"pte"``) and .ptd (``"ptd"``) sources: they are trusted when the loader
    reports the same size and entity tag, else the source is hashed again."""

    sources: dict[str, SourceInfo] = field(default_factory=dict)
    #: Fixed creation time (ISO 8601, UTC) instead of now.
    created: str | None = None
    #: The fleet job file the run belongs to (path and SHA-256), recorded as ``job``.
    job: JobStamp | None = None


class Stamper:
    """Collects what the provenance of one run needs, then writes the trailers."""

    def __init__(
        self,
        request: ProvenanceRequest,
        backends: Iterable[BackendLike] | None,
        device: DeviceProfile | None,
    ) -> None:
        self.request = request
        self.device = device
        self.requested: list[tuple[str, BackendInterface]] = []
        self._given = backends is not None
        if backends is not None:
            for b in backends:
                _check_spec(b)
                impl = load_backend(b)
                if isinstance(b, str):
                    try:  # messages then name the SPEC as given
                        vars(impl)[SPEC_ATTRIBUTE] = b.strip()
                    except TypeError:  # no instance dict (slots)
                        pass
                self.requested.append((spec_text(b), impl))
        self.stamps: list[BackendStamp] = []
        #: Each implementation's version, read once per run (:meth:`version`).
        self._versions: list[tuple[BackendInterface, str]] = []
        self.sources: dict[str, SourceInfo] = {}
        #: Sources being described in threads: role -> (the work, the source's name).
        self._describing: dict[str, tuple[Background[SourceInfo], str]] = {}
        #: Each output's bytes before its trailer (see :meth:`seal`).
        self.contents: dict[str, ContentDigest] = {}
        self._trailers: dict[str, bytes] = {}
        self._created = request.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    @property
    def backends(self) -> list[BackendInterface] | None:
        """The loaded implementations, to run instead of the specs (so each spec is
        instantiated once); None when the run uses the registry."""
        return [i for _, i in self.requested] if self._given else None

    def describe_sources(self, loaders: Sequence[tuple[str, DataLoader]]) -> None:
        """Describe each ``(role, loader)`` source: a large local one in a thread of its
        own while the run goes on (see :data:`CONCURRENT_MIN`; :meth:`close` stops it),
        any other at once."""
        from ..storage.loaders import LocalFileLoader  # reads from any thread (pread)

        for role, loader in loaders:
            known = self.request.sources.get(role)
            etag = getattr(loader, "etag", None)
            if (
                known is not None
                and known.size == loader.size()
                and known.etag is not None
                and known.etag == etag
            ):
                self.sources[role] = known
                if known.chunks is not None:  # described by the planner: its chunks too
                    from .known import remember

                    remember(loader, known.chunks)
                continue
            like = None if known is None else known.sha256
            if isinstance(loader, LocalFileLoader) and loader.size() >= CONCURRENT_MIN:
                work = functools.partial(_describe_cancellable, loader, like)
                self._describing[role] = (
                    Background("ptestore-describe-source", work),
                    loader.name,
                )
            else:
                self._described(role, describe_source(loader, like=like), loader.name)

    def wait_sources(self) -> None:
        """Wait for the sources being described (so their chunk digests are known to
        the output's digest, :mod:`.known`); may run in another thread (a failed
        description is reported where the run asks for it)."""
        for pending, _ in list(self._describing.values()):
            try:
                pending.result()
            except BaseException:  # reported where the run asks for it (_source)
                return

    def _described(self, role: str, info: SourceInfo, name: str) -> None:
        known = self.request.sources.get(role)
        if known is not None and known.sha256 != info.sha256:
            raise StorageError(
                f"{name}: source changed since it was described: sha256 "
                f"{info.sha256}, expected {known.sha256}"
            )
        self.sources[role] = info

    def described(self) -> bool:
        """Whether every source is described by now, without waiting: a description that
        ended is taken in (one that failed is left for where the run asks for it)."""
        for role, (pending, _) in list(self._describing.items()):
            if not pending.done():
                return False
            try:
                self._source(role)
            except Exception:
                return False
        return not self._describing

    def _source(self, role: str) -> SourceInfo | None:
        """The description of ``role``'s source (waiting for it where it is being made)."""
        pending = self._describing.get(role)
        if pending is not None:  # (left in _describing until done: close() cancels it)
            info = pending[0].result()
            del self._describing[role]
            self._described(role, info, pending[1])
        return self.sources.get(role)

    def close(self) -> None:
        """Stop describing sources (a run that ends early: at most one more 8 MiB piece
        is read); what was described stays."""
        while self._describing:
            self._describing.popitem()[1][0].cancel()

    def spec_of(self, impl: BackendInterface) -> str:
        for spec, inst in self.requested:
            if inst is impl:
                return spec
        return spec_text(impl) if impl.name == "*" else impl.name

    def version(self, impl: BackendInterface, backend: str) -> str:
        """``impl``'s version, read once per run (the run reads it before the backend's
        call: what a fresh instance reports, which is what ``verify``, a fleet plan and
        the device cache compare) and recorded alike in ``requested`` and ``backends``;
        errors name ``backend``."""
        for known, version in self._versions:
            if known is impl:
                return version
        version = version_of(impl, backend)
        self._versions.append((impl, version))
        return version

    def note(
        self, backend_id: str, impl: BackendInterface, context: BackendDataInitContext
    ) -> None:
        """Record that ``impl`` served ``backend_id`` and its compatibility string (the
        errors name the backend by its id: the run adds its spec)."""
        # Backend code: a sys.exit() in it is its failure, named as such (the run's own
        # guard would call it initialize_backend_data's).
        info = guarded(backend_id, "compatibility_info", impl.compatibility_info, context)
        version = self.version(impl, backend_id)
        if not isinstance(info, str):
            raise BackendError(
                f"compatibility_info returned {type(info).__name__}, not str", backend=backend_id
            )
        problem = unrecordable(
            info,
            "compatibility_info returned",
            MAX_COMPATIBILITY_INFO,
            "provenance records it in the artifact",
        )
        if problem is not None:
            raise BackendError(problem, backend=backend_id)
        self.stamps.append(BackendStamp(backend_id, self.spec_of(impl), version, info))

    def _pte_source(self) -> SourceInfo:
        info = self._source("pte")
        if info is None:
            raise KeyError("pte: its source was never described")
        return info

    def key(self) -> ProvenanceKey:
        return self.provenance("pte").key()

    def provenance(self, role: Literal["pte", "ptd"]) -> Provenance:
        return Provenance(
            role=role,
            source=self._pte_source(),
            ptd_source=self._source("ptd"),
            requested=tuple(RequestedBackend(s, self.version(i, s)) for s, i in self.requested),
            backends=tuple(self.stamps),
            device=None
            if self.device is None
            else DeviceStamp(self.device.name, self.device.digest(), dict(self.device.options)),
            ptestore_version=_ptestore_version(),
            created=self._created,
            content=self.contents.get(role),
            ptd_output=self.contents.get("ptd") if role == "pte" else None,
            job=self.request.job,
        )

    def seal(self, role: Literal["pte", "ptd"], content: ContentDigest) -> dict[str, str]:
        """Fix ``role``'s trailer for an output whose bytes before the trailer are
        ``content`` (seal the .ptd first: the .pte's record names it) and return the
        S3 metadata that mirrors it (``ptestore-content-sha256``)."""
        self.contents[role] = content
        data = encode_trailer(self.provenance(role).to_dict(), content.size)
        self._trailers[role] = data
        return {f"{METADATA_PREFIX}content-sha256": content.sha256}

    def trailer(self, role: str) -> bytes:
        """The trailer bytes :meth:`seal` fixed for ``role``."""
        return self._trailers[role]

    def write_trailers(
        self, outputs: Sequence[tuple[Literal["pte", "ptd"], DataWriter, int]]
    ) -> int:
        """Write a trailer after each ``(role, writer, content_size)`` output; returns
        the bytes written."""
        total = 0
        for role, writer, content_size in outputs:
            data = self._trailers.get(role)
            if data is None:
                data = encode_trailer(self.provenance(role).to_dict(), content_size)
            writer.write(data, content_size)
            total += len(data)
        return total


def object_metadata(key: ProvenanceKey, device: DeviceProfile | None) -> dict[str, str]:
    """S3 user metadata mirroring the provenance key (``x-amz-meta-ptestore-*``), so a
    ``HEAD`` can tell a current artifact from a stale one."""
    meta = {
        f"{METADATA_PREFIX}provenance": "1",
        f"{METADATA_PREFIX}key": key.digest(),
        f"{METADATA_PREFIX}source-sha256": key.source_sha256,
    }
    if device is not None:
        meta[f"{METADATA_PREFIX}device"] = device.name
        meta[f"{METADATA_PREFIX}device-digest"] = device.digest()
    return meta
