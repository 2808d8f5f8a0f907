"""What a provenance trailer says, as typed values: :class:`Provenance` and its parts.

The JSON payload (``format = "ptestore.provenance"``, ``version = 3``; 1 and 2 are read)::

    {"format": "ptestore.provenance", "version": 1, "role": "pte",
     "source": {"url", "size", "sha256", "etag", "version_id"},   # sha256: see below
     "ptd_source": {...} | null,
     "requested": [{"spec", "version"}],          # the backends asked for, in order
     "backends": [{"id", "spec", "version", "compatibility"}],   # per backend id run
     "device": {"name", "digest", "options"} | null,
     "content": {"size", "sha256", "crc32",        # this file before its trailer
                 "chunks": {"size", "sha256", "root"},   # version 2: see .chunks
                 "crcs": {...}},                          # optional: see .crcs
     "ptd_output": {"size", "sha256", "crc32"} | null,  # a .pte's .ptd (before its trailer)
     "job": {"path", "sha256"} | null,             # the fleet job file that made it
     "ptestore_version": "0.1.0", "created": "2026-12-01T08:00:00Z"}

Every ``sha256`` that names bytes (``source``, ``ptd_source``, ``content``,
``ptd_output``) is, since version 3, the root of their chunk digests written
``sha256-tree:<hex>`` (:mod:`.chunks`): a run derives it from the chunks it keeps and
the ones it writes instead of reading every byte. Versions 1 and 2 name the whole-file
SHA-256 (``sha256:<hex>``); a check computes whichever a record names. In version 3
``content.sha256`` (and ``ptd_output.sha256``) must be the root of its ``chunks``
(checked on reading). A record keeps the version it was read with
(:attr:`Provenance.version`): one read from a version-1 trailer is written out (a
cache's manifest, ``--json``) as version 1. A ``url`` is recorded, and read back (an
earlier trailer's too), without credentials (:func:`~ptestore.storage.types.redacted_url`).

``content``, ``ptd_output``, ``job`` and ``device.options`` are absent from records
written before ptestore bound artifacts to their bytes; such an artifact can be read
but never trusted as current (nothing ties the record to the bytes).

:meth:`Provenance.key` is what decides whether an artifact is current: the source
digests, the requested backend specs and versions, and the device name and digest.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

from .._dataclass import dataclass, field
from ..backends.compat import canonical_json
from ..errors import FormatError
from ..storage.types import redacted_url

if TYPE_CHECKING:
    from .chunks import ChunkDigests, Known
    from .crcs import ContentCRCs
    from .trailer import Trailer

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "BackendStamp",
    "ContentDigest",
    "DeviceStamp",
    "JobStamp",
    "Provenance",
    "ProvenanceKey",
    "RequestedBackend",
    "SourceInfo",
]

FORMAT = "ptestore.provenance"
#: Version 2 adds ``content.chunks`` (and ``ptd_output.chunks``); version 3 names
#: bytes by their chunk root (``sha256-tree:``); 1 and 2 are still read.
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)


def _field(where: str, key: str) -> str:
    return f"provenance {where}.{key}" if where else f"provenance {key}"


#: The digests that name bytes (``sha256-tree:`` since record version 3); a job file's
#: and a device's options' digests are the whole SHA-256 (``sha256:``) only.
_NAMES_BYTES = ("sha256", "sha256-tree")
_KIND_WORDS = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _get(d: dict[str, Any], key: str, kind: type, source: str, where: str) -> Any:
    value = d.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FormatError(source, _field(where, key), value, _KIND_WORDS.get(kind, kind.__name__))
    return value


def _size(d: dict[str, Any], key: str, source: str, where: str) -> int:
    """A byte count: an integer in [0, 2**64) (what a file's size can be)."""
    value: int = _get(d, key, int, source, where)
    if not 0 <= value < 1 << 64:
        raise FormatError(source, _field(where, key), value, "an integer in [0, 2**64)")
    return value


def _digest(
    d: dict[str, Any], key: str, source: str, where: str, kinds: tuple[str, ...] = _NAMES_BYTES
) -> str:
    """A digest: one of ``kinds`` (by default a digest that names bytes, ``sha256:`` or
    ``sha256-tree:``: what a check knows how to compute), then 64 lowercase hex digits."""
    from .chunks import well_formed

    value: str = _get(d, key, str, source, where)
    if not well_formed(value, kinds):
        allowed = " or ".join(f"'{k}:'" for k in kinds) + " followed by 64 lowercase hex digits"
        raise FormatError(source, _field(where, key), value, allowed)
    return value


def _crc32(d: dict[str, Any], source: str, where: str) -> int:
    """A CRC-32: an integer in [0, 2**32)."""
    value: int = _get(d, "crc32", int, source, where)
    if not 0 <= value < 1 << 32:
        raise FormatError(source, _field(where, "crc32"), value, "an integer in [0, 2**32)")
    return value


def _opt_str(d: dict[str, Any], key: str, source: str, where: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise FormatError(source, _field(where, key), value, "a string or null")
    return value


@dataclass(frozen=True)
class SourceInfo:
    """The object a file was made from: URL (no credentials), size, SHA-256 and, where
    the store has them, entity tag and version id."""

    url: str
    size: int
    sha256: str
    etag: str | None = None
    version_id: str | None = None
    #: The object's chunk digests and CRCs (:class:`~.known.Known`) where the
    #: description computed them: not recorded, but carried to a fleet worker with the
    #: description so the worker does not read the source again. Not compared.
    chunks: Known | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "size": self.size,
            "sha256": self.sha256,
            "etag": self.etag,
            "version_id": self.version_id,
        }

    @classmethod
    def from_dict(cls, d: object, source: str, where: str) -> SourceInfo:
        if not isinstance(d, dict):
            raise FormatError(source, f"provenance {where}", d, "an object")
        return cls(
            url=redacted_url(_get(d, "url", str, source, where)),
            size=_size(d, "size", source, where),
            sha256=_digest(d, "sha256", source, where),
            etag=_opt_str(d, "etag", source, where),
            version_id=_opt_str(d, "version_id", source, where),
        )


@dataclass(frozen=True)
class RequestedBackend:
    """A backend the run was asked to use: its SPEC and the implementation's version."""

    spec: str
    version: str

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "version": self.version}


@dataclass(frozen=True)
class BackendStamp:
    """One backend id of the program and what served it."""

    id: str
    spec: str
    version: str
    #: The implementation's ``compatibility_info(context)`` ("" when it gives none).
    compatibility: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spec": self.spec,
            "version": self.version,
            "compatibility": self.compatibility,
        }


@dataclass(frozen=True)
class DeviceStamp:
    """The device profile: its name, the digest of its options and (in records that
    keep them) the options themselves."""

    name: str
    digest: str
    options: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "digest": self.digest}
        if self.options is not None:
            out["options"] = self.options
        return out


@dataclass(frozen=True)
class ContentDigest:
    """Size, digest and CRC-32 (zlib, as an integer) of a file's bytes before its
    trailer, and (records of version 2 on) their chunk digests. ``sha256`` is the
    digest: ``sha256-tree:<hex>``, the chunk root (version 3), or ``sha256:<hex>``, the
    whole SHA-256 (versions 1 and 2)."""

    size: int
    sha256: str
    crc32: int
    #: SHA-256 per chunk and their root (:mod:`.chunks`); None in version-1 records.
    #: Not compared: the SHA-256 already names the bytes.
    chunks: ChunkDigests | None = field(default=None, compare=False)
    #: CRC-32C and CRC64NVME, whole and per chunk (:mod:`.crcs`); None when not
    #: recorded. Not compared.
    crcs: ContentCRCs | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size, "sha256": self.sha256, "crc32": self.crc32}
        if self.chunks is not None:
            out["chunks"] = self.chunks.to_dict()
        if self.crcs is not None:
            out["crcs"] = self.crcs.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: object, source: str, where: str, tree: bool = False) -> ContentDigest:
        """``tree``: of a version-3 record, whose digest must be its chunks' root."""
        if not isinstance(d, dict):
            raise FormatError(source, f"provenance {where}", d, "an object")
        size = _size(d, "size", source, where)
        chunks = None
        if d.get("chunks") is not None:
            from .chunks import ChunkDigests

            chunks = ChunkDigests.from_dict(d["chunks"], size, source, where)
        crcs = None
        if d.get("crcs") is not None:
            from .crcs import ContentCRCs

            crcs = ContentCRCs.from_dict(d["crcs"], size, source, where)
        digest = _digest(d, "sha256", source, where)
        root = None if chunks is None else chunks.digest
        if (tree or digest.startswith("sha256-tree:")) and root != digest:
            said = "the root of its chunks" + ("" if root else f" ({where}.chunks.root)")
            said = f"{root}, {said}" if root else said
            raise FormatError(source, _field(where, "sha256"), digest, said)
        return cls(size, digest, _crc32(d, source, where), chunks, crcs)


@dataclass(frozen=True)
class JobStamp:
    """The fleet job file an artifact was made by: its path and SHA-256."""

    path: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256}


@dataclass(frozen=True)
class ProvenanceKey:
    """The fields that make an artifact current (see :meth:`Provenance.key`)."""

    source_sha256: str
    ptd_sha256: str | None
    backends: tuple[tuple[str, str], ...]
    device: tuple[str, str] | None

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of the key."""
        text = canonical_json(
            [
                self.source_sha256,
                self.ptd_sha256,
                [list(b) for b in self.backends],
                list(self.device) if self.device else None,
            ]
        )
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def mismatches(self, want: ProvenanceKey) -> list[str]:
        """Human-readable differences, ``[]`` when the keys match (``self`` is what the
        artifact records, ``want`` what it should)."""
        out: list[str] = []
        if self.source_sha256 != want.source_sha256:
            out.append(f"source.sha256 is {self.source_sha256}, expected {want.source_sha256}")
        if self.ptd_sha256 != want.ptd_sha256:
            out.append(f"ptd_source.sha256 is {self.ptd_sha256}, expected {want.ptd_sha256}")
        if self.backends != want.backends:
            have = ", ".join(f"{s} {v}" for s, v in self.backends) or "none"
            exp = ", ".join(f"{s} {v}" for s, v in want.backends) or "none"
            out.append(f"backends are [{have}], expected [{exp}]")
        if self.device != want.device:
            out.append(f"device is {_dev(self.device)}, expected {_dev(want.device)}")
        return out


def _dev(d: tuple[str, str] | None) -> str:
    return "none" if d is None else f"{d[0]} ({d[1]})"


@dataclass(frozen=True)
class Provenance:
    """Everything a trailer records about the file it ends."""

    role: Literal["pte", "ptd"]
    source: SourceInfo
    ptd_source: SourceInfo | None
    requested: tuple[RequestedBackend, ...]
    backends: tuple[BackendStamp, ...]
    device: DeviceStamp | None
    ptestore_version: str
    created: str
    #: This file's bytes before the trailer (None in records made before it existed).
    content: ContentDigest | None = None
    #: For a .pte of a pair: its .ptd's bytes before the .ptd's trailer.
    ptd_output: ContentDigest | None = None
    job: JobStamp | None = None
    #: The record format version: the one it was read with, else this ptestore's.
    version: int = FORMAT_VERSION

    def key(self) -> ProvenanceKey:
        return ProvenanceKey(
            self.source.sha256,
            None if self.ptd_source is None else self.ptd_source.sha256,
            tuple((b.spec, b.version) for b in self.requested),
            None if self.device is None else (self.device.name, self.device.digest),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "role": self.role,
            "source": self.source.to_dict(),
            "ptd_source": None if self.ptd_source is None else self.ptd_source.to_dict(),
            "requested": [b.to_dict() for b in self.requested],
            "backends": [b.to_dict() for b in self.backends],
            "device": None if self.device is None else self.device.to_dict(),
            "ptestore_version": self.ptestore_version,
            "created": self.created,
            "content": None if self.content is None else self.content.to_dict(),
            "ptd_output": None if self.ptd_output is None else self.ptd_output.to_dict(),
            "job": None if self.job is None else self.job.to_dict(),
        }

    @classmethod
    def of_trailer(cls, trailer: Trailer, source: str) -> Provenance:
        """The record ``trailer`` carries (:meth:`from_dict`), bound to it: a
        ``content.size`` other than the trailer's own ``content_size`` (where it starts)
        claims other bytes than precede it and is refused (:class:`FormatError`) before
        anything relies on its size or its chunk digests."""
        prov = cls.from_dict(trailer.record(), source)
        if prov.content is not None and prov.content.size != trailer.content_size:
            raise FormatError(
                source,
                "provenance content.size",
                prov.content.size,
                f"{trailer.content_size}, the bytes before the provenance trailer (its "
                "footer's content_size)",
            )
        return prov

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str) -> Provenance:
        """Parse and check a payload; :class:`FormatError` names the bad field."""
        if d.get("format") != FORMAT:
            raise FormatError(source, "provenance format", d.get("format"), repr(FORMAT))
        version = d.get("version")  # True == 1 in Python: a bool is no version
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise FormatError(
                source, "provenance version", d.get("version"), "1, 2 or 3 (this ptestore's)"
            )
        role = d.get("role")
        if role not in ("pte", "ptd"):
            raise FormatError(source, "provenance role", role, "'pte' or 'ptd'")
        ptd = d.get("ptd_source")
        requested = []
        for i, b in enumerate(_get(d, "requested", list, source, "")):
            w = f"requested[{i}]"
            if not isinstance(b, dict):
                raise FormatError(source, f"provenance {w}", b, "an object")
            requested.append(
                RequestedBackend(
                    _get(b, "spec", str, source, w), _get(b, "version", str, source, w)
                )
            )
        stamps = []
        for i, b in enumerate(_get(d, "backends", list, source, "")):
            w = f"backends[{i}]"
            if not isinstance(b, dict):
                raise FormatError(source, f"provenance {w}", b, "an object")
            stamps.append(
                BackendStamp(
                    _get(b, "id", str, source, w),
                    _get(b, "spec", str, source, w),
                    _get(b, "version", str, source, w),
                    _get(b, "compatibility", str, source, w),
                )
            )
        dev = d.get("device")
        device = None
        if dev is not None:
            if not isinstance(dev, dict):
                raise FormatError(source, "provenance device", dev, "an object or null")
            opts = dev.get("options")
            if opts is not None and not isinstance(opts, dict):
                raise FormatError(source, "provenance device.options", opts, "an object or null")
            device = DeviceStamp(
                _get(dev, "name", str, source, "device"),
                _digest(dev, "digest", source, "device", ("sha256",)),
                opts,
            )
        content, ptd_output, job = d.get("content"), d.get("ptd_output"), d.get("job")
        tree = version >= 3  # bytes named by their chunk root (docs/concepts.md)
        if job is not None and not isinstance(job, dict):
            raise FormatError(source, "provenance job", job, "an object or null")
        return cls(
            role=role,
            source=SourceInfo.from_dict(d.get("source"), source, "source"),
            ptd_source=None if ptd is None else SourceInfo.from_dict(ptd, source, "ptd_source"),
            requested=tuple(requested),
            backends=tuple(stamps),
            device=device,
            ptestore_version=_get(d, "ptestore_version", str, source, ""),
            created=_get(d, "created", str, source, ""),
            content=None
            if content is None
            else ContentDigest.from_dict(content, source, "content", tree),
            ptd_output=None
            if ptd_output is None
            else ContentDigest.from_dict(ptd_output, source, "ptd_output", tree),
            job=None
            if job is None
            else JobStamp(
                _get(job, "path", str, source, "job"),
                _digest(job, "sha256", source, "job", ("sha256",)),
            ),
            version=version,
        )
