"""``ptestore.verify``: is an artifact intact, and is it current?

Checks, in order, each adding findings to a :class:`VerifyReport`:

1. **integrity**: the container parses (header, FlatBuffer, every segment inside the
   file) and the provenance trailer is present with a valid checksum and record;
2. **source** (given one): the artifact was made from exactly these bytes (SHA-256 and
   size of the whole source object);
3. **backends** (given specs): the same specs, in order, at the same versions, and every
   implementation rates the stamped compatibility string ``OPTIMAL`` for the device;
4. **device** (given a profile): the same name and options digest.

``exit_code``: 0 current, 1 stale or mismatched (each finding names its field), 2 bad
input or a corrupt artifact.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends.compat import Compatibility, DeviceProfile
from .backends.registry import BackendLike, load_backend
from .errors import ConfigurationError, FormatError, ObjectNotFound, PteStoreError
from .format.reader import read_container
from .provenance import Provenance, read_trailer, spec_text
from .provenance.stamp import describe_source
from .provenance.trailer import ContentView
from .storage.loaders import open_loader
from .storage.routing import StorageOptions

__all__ = ["Finding", "VerifyReport", "verify"]

EXIT_CURRENT = 0
EXIT_STALE = 1
EXIT_INVALID = 2


@dataclass(frozen=True)
class Finding:
    """One reason an artifact is not current: the field and what is wrong with it."""

    field: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``status`` is ``"current"``, ``"stale"`` or
    ``"invalid"`` (bad input or a corrupt artifact)."""

    url: str
    status: str = "current"
    findings: list[Finding] = field(default_factory=list)
    provenance: Provenance | None = None
    #: Backend id -> the rating its implementation gave (with ``backends``).
    compatibility: dict[str, Compatibility] = field(default_factory=dict)
    error: str | None = None

    @property
    def exit_code(self) -> int:
        return {"current": EXIT_CURRENT, "stale": EXIT_STALE}.get(self.status, EXIT_INVALID)

    @property
    def ok(self) -> bool:
        return self.status == "current"

    def stale(self, field_name: str, message: str) -> None:
        self.findings.append(Finding(field_name, message))
        if self.status == "current":
            self.status = "stale"

    def message(self) -> str:
        """One line per finding, or the verdict."""
        if self.status == "invalid":
            return f"{self.url}: invalid: {self.error}"
        if not self.findings:
            return f"{self.url}: current"
        return "\n".join(f"{self.url}: stale: {f.field}: {f.message}" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "findings": [f.to_dict() for f in self.findings],
            "compatibility": {k: v.value for k, v in self.compatibility.items()},
            "provenance": None if self.provenance is None else self.provenance.to_dict(),
        }


def verify(
    url: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    backends: Sequence[BackendLike] | None = None,
    device: DeviceProfile | str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> VerifyReport:
    """Check the artifact at ``url`` (see the module docstring).

    Args:
        url: the artifact (``.pte`` or ``.ptd``; a local path or fsspec URL).
        source: the source it should have been made from (its digest is compared).
        backends: the backends it should have been made with, in order (SPECs, classes
            or instances; names and versions are compared, and each is asked whether
            the artifact is optimal).
        device: a :class:`DeviceProfile` (name and options digest are compared) or a
            name (only the name is).
        storage_options: storage options for ``url`` and ``source``, routed as
            :func:`~ptestore.specialize` routes its ``storage_options`` (``url`` is the
            destination, ``source`` the source: each gets those its loader accepts; one
            that applies to neither, read or written, is refused). A fleet job's
            options can be passed as they are.

    Returns:
        A :class:`VerifyReport`: ``status`` ``"current"``, ``"stale"`` (each finding
        names its field) or ``"invalid"`` (corrupt, missing or bad input, with
        ``error``), and ``exit_code`` 0, 1 or 2 to match.

    Raises:
        Nothing for a stale, corrupt or missing artifact or bad input (the report says
        so); storage failures other than a missing object (``StorageError``,
        ``PermissionDenied``) propagate.
    """
    target = os.fspath(url)
    from .journal import recover_if_local

    recover_if_local(target)  # an interrupted in-place specialization: finish it first
    report = VerifyReport(target)
    opts = StorageOptions(storage_options)
    try:
        opts.check([] if source is None else [source], [target])
        _check(report, target, source, backends, device, opts)
    except (FormatError, ObjectNotFound, ConfigurationError) as exc:
        report.status = "invalid"
        report.error = str(exc)
    return report


def _check(
    report: VerifyReport,
    target: str,
    source: str | os.PathLike[str] | None,
    backends: Sequence[BackendLike] | None,
    device: DeviceProfile | str | None,
    opts: StorageOptions,
) -> None:
    loader = open_loader(target, **opts.for_loader(target, "dst"))
    try:
        trailer = read_trailer(loader)
        content = loader if trailer is None else ContentView(loader, trailer.content_size)
        read_container(content)  # structure: headers, FlatBuffer, segment bounds
        if trailer is None:
            raise FormatError(
                target, "provenance trailer", None, "present (an artifact made with provenance)"
            )
        prov = Provenance.from_dict(trailer.record(), target)
    finally:
        loader.close()
    report.provenance = prov
    if source is not None:
        src = os.fspath(source)
        src_loader = open_loader(src, **opts.for_loader(src, "src"))
        try:
            info = describe_source(src_loader)
        finally:
            src_loader.close()
        made = prov.ptd_source if prov.role == "ptd" else prov.source
        field_name = "ptd_source.sha256" if prov.role == "ptd" else "source.sha256"
        if made is None or info.sha256 != made.sha256 or info.size != made.size:
            was = "nothing" if made is None else f"{made.url} ({made.size} bytes, {made.sha256})"
            report.stale(
                field_name,
                f"the artifact was made from {was}, not from {src} ({info.size} bytes, "
                f"{info.sha256})",
            )
    profile = device if isinstance(device, DeviceProfile) else None
    if backends is not None:
        _check_backends(report, prov, backends, profile)
    if device is not None:
        name = device.name if isinstance(device, DeviceProfile) else device
        have = prov.device
        if have is None or have.name != name:
            report.stale(
                "device.name",
                f"made for {'no device' if have is None else repr(have.name)}, expected {name!r}",
            )
        elif profile is not None and have.digest != profile.digest():
            report.stale(
                "device.digest",
                f"device {name!r} options digest is {have.digest}, expected "
                f"{profile.digest()} (the profile's options changed)",
            )


def _check_backends(
    report: VerifyReport,
    prov: Provenance,
    backends: Sequence[BackendLike],
    device: DeviceProfile | None,
) -> None:
    loaded = [(spec_text(b), load_backend(b)) for b in backends]
    want = [(s, str(i.version)) for s, i in loaded]
    have = [(b.spec, b.version) for b in prov.requested]
    if [s for s, _ in want] != [s for s, _ in have]:
        report.stale(
            "backends.spec",
            f"made with [{', '.join(s for s, _ in have) or 'none'}], expected "
            f"[{', '.join(s for s, _ in want) or 'none'}]",
        )
        return
    for (spec, version), (_, recorded) in zip(want, have, strict=True):
        if version != recorded:
            report.stale(
                "backends.version",
                f"{spec} made it at version {recorded}; the installed version is {version}",
            )
    impls = dict(loaded)
    for stamp in prov.backends:
        impl = impls.get(stamp.spec)
        if impl is None:
            continue
        try:
            rating = impl.check_compatibility(stamp.compatibility, device)
        except PteStoreError:
            raise
        except Exception as exc:
            raise ConfigurationError(
                f"backend {stamp.spec!r}: check_compatibility failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(rating, Compatibility):
            raise ConfigurationError(
                f"backend {stamp.spec!r}: check_compatibility returned {rating!r}, "
                "not a Compatibility"
            )
        report.compatibility[stamp.id] = rating
        if rating is not Compatibility.OPTIMAL:
            report.stale(
                "backends.compatibility",
                f"{stamp.spec} rates the {stamp.id} data {rating.value} for "
                f"{'no device' if device is None else repr(device.name)} "
                f"(stamped {stamp.compatibility!r})",
            )
