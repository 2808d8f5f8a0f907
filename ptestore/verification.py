"""``ptestore.verify``: is an artifact intact, and is it current?

Checks, in order, each adding findings to a :class:`VerifyReport`:

1. **integrity**: the container parses (header, FlatBuffer, every segment inside the
   file), the provenance trailer is present with a valid checksum and record, and the
   bytes before the trailer have the SHA-256 the record names (a full read; ``quick``
   skips it); for a ``.pte`` whose record names a ``.ptd``, that ``.ptd`` (given, or
   beside the ``.pte``) is the very one it was made with, for the same key;
2. **source** (given one): the artifact was made from exactly these bytes (SHA-256 and
   size of the whole source object);
3. **backends** (given specs): the same specs, in order, at the same versions, and every
   implementation rates the stamped compatibility string ``OPTIMAL`` for the device;
4. **device** (given a profile): the same name and options digest;
5. **XNNPACK packed weights** (a fleet's .pte with its packed-weight file beside it, or
   ``xnnpack_cpu`` given): the record is bound to this artifact and names that CPU, the
   file has its recorded size and SHA-256 (:func:`ptestore.fleet.packing.check_beside`).

``status``: ``"intact"`` when nothing was given to compare with (only integrity was
checked), ``"current"``, ``"stale"`` or ``"invalid"``. ``exit_code``: 0 intact or current,
1 stale or mismatched (each finding names its field), 2 a corrupt artifact. A missing
artifact or source and bad arguments are no verdict: :func:`verify` raises them
(:class:`~ptestore.errors.ObjectNotFound`, :class:`~ptestore.errors.ConfigurationError`),
as every other call does. An object replaced while it is read (S3 reads are pinned to
the version first read) is neither: :func:`verify` raises
:class:`~ptestore.errors.StorageError` ("changed while being verified"; the command
exits 1).
"""

from __future__ import annotations

import os
import string
from collections.abc import Sequence
from typing import Any

from . import _args
from ._dataclass import dataclass, field
from ._text import REPORT_CHARS, clipped, printable, shown
from .backends.compat import Compatibility, DeviceProfile, version_of
from .backends.rating import rate_stamps
from .backends.registry import BackendLike, load_backend
from .errors import BackendError, FormatError, PreconditionFailed, StorageError
from .integrity import check_content_address, check_ptd, is_plain, read_checked
from .provenance import Provenance, spec_text
from .provenance.profile import named_profile, option_changes
from .provenance.stamp import describe_source
from .storage.loaders import open_loader
from .storage.routing import StorageOptions
from .storage.types import redact_urls, redacted_url

__all__ = ["Finding", "VerifyReport", "verify"]

EXIT_CURRENT = 0
EXIT_STALE = 1
EXIT_INVALID = 2


class _Unrated(Exception):
    """A backend's ``check_compatibility`` failed on the artifact's stamp: the
    artifact is reported invalid, the failure as its error (docs/fleet.md)."""


@dataclass(frozen=True)
class Finding:
    """One reason an artifact is not current: the field and what is wrong with it
    (``message``, whole: ``--json``); ``text``, when set, the same with each string the
    record gave cut to :data:`~ptestore._text.REPORT_CHARS` (the text report's line)."""

    field: str
    message: str
    text: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``status`` is ``"intact"`` (nothing to compare with),
    ``"current"``, ``"stale"`` or ``"invalid"`` (bad input or a corrupt artifact);
    ``verify --job`` adds ``"unverified"`` for a pair whose storage failed (``error``
    says how; exit 1: verifying again may succeed)."""

    url: str
    status: str = "current"
    findings: list[Finding] = field(default_factory=list)
    provenance: Provenance | None = None
    #: Backend id -> the rating its implementation gave (with ``backends``).
    compatibility: dict[str, Compatibility] = field(default_factory=dict)
    error: str | None = None
    #: Whether the bytes were checked against the record's SHA-256 (not with ``quick``).
    content_checked: bool = False
    #: The .ptd checked with a .pte (None when there was none).
    ptd: str | None = None
    #: With ``quick``: the .ptd has no trailer, so only its size was compared.
    ptd_size_only: bool = False
    #: The XNNPACK packed-weight file beside a fleet's .pte that was checked (None: none).
    xnnpack: str | None = None
    #: A fleet's shared content-addressed .ptd: it has no record, so nothing given
    #: (source, backends, device) could be compared; it is at most intact.
    shared: bool = False

    @property
    def exit_code(self) -> int:
        return {
            "current": EXIT_CURRENT,
            "intact": EXIT_CURRENT,
            "stale": EXIT_STALE,
            "unverified": EXIT_STALE,
        }.get(self.status, EXIT_INVALID)

    @property
    def ok(self) -> bool:
        return self.status in ("current", "intact")

    def stale(self, field_name: str, message: str, text: str | None = None) -> None:
        # a finding may quote a URL (the artifact's, its .ptd's, a source's): redacted
        text = None if text is None else redact_urls(text)
        self.findings.append(Finding(field_name, redact_urls(message), text))
        if self.status in ("current", "intact"):
            self.status = "stale"

    def message(self) -> str:
        """One line per finding, or the verdict."""
        # As given, its credentials redacted: a name cannot drive the terminal either.
        url = printable(redacted_url(self.url))
        # An error may quote the file (a record's key in a field name): printable, one line.
        if self.status == "invalid":
            return f"{url}: invalid: {printable(redact_urls(str(self.error)))}"
        if self.status == "unverified":
            return f"{url}: not verified: {printable(redact_urls(str(self.error)))}"
        if not self.findings:
            quick = "" if self.content_checked else " (--quick: content SHA-256 not checked)"
            if self.ptd_size_only:
                ptd = printable(redact_urls(str(self.ptd)))
                quick += f"; {ptd} has no trailer: compared by size only"
            if self.xnnpack is not None:
                packed = printable(redact_urls(self.xnnpack))
                quick += f"; its XNNPACK packed-weight file {packed} checked"
            if self.status == "intact" and self.shared:
                return (
                    f"{url}: intact{quick}; a shared content-addressed .ptd has no "
                    "record of its own: nothing given could be compared with it (verify "
                    "the .pte files that use it)"
                )
            if self.status == "intact":
                return (
                    f"{url}: intact{quick}; nothing to compare with (give --source, "
                    "--backend, --device or --job to tell current from stale)"
                )
            return f"{url}: current{quick}"
        # A finding quotes the record (specs, versions, names): one printable line each,
        # each string cut (``text``), the line too (a finding that quotes one whole).
        return "\n".join(
            f"{url}: stale: {f.field}: {printable(clipped(f.text or f.message, 8 * REPORT_CHARS))}"
            for f in self.findings
        )

    def to_dict(self) -> dict[str, Any]:
        shown = _redacted_or_none
        return {
            "url": redacted_url(self.url),
            "status": self.status,
            "exit_code": self.exit_code,
            "error": shown(self.error),
            "content_checked": self.content_checked,
            "ptd": shown(self.ptd),
            "xnnpack": shown(self.xnnpack),
            "shared": self.shared,
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
    ptd: str | os.PathLike[str] | None = None,
    quick: bool = False,
    xnnpack_cpu: str | None = None,
    ptd_source: str | os.PathLike[str] | None = None,
    as_planned: bool = False,
) -> VerifyReport:
    """Check the artifact at ``url`` (see the module docstring).

    Args:
        url: the artifact (``.pte`` or ``.ptd``; a local path or fsspec URL).
        source: the source it should have been made from (its digest is compared).
        backends: the backends it should have been made with, in order (SPECs, classes
            or instances; names and versions are compared, and each is asked whether
            the artifact is optimal).
        device: a :class:`DeviceProfile` (name and options digest are compared) or a
            name (only the name is; the backends' ``check_compatibility`` gets the
            profile the record keeps for that name, its options included; a record that
            keeps no options, or another name, gives a profile without options, and a
            finding that follows says to give them).
        storage_options: storage options for ``url`` and ``source``, routed as
            :func:`~ptestore.specialize` routes its ``storage_options`` (``url`` is the
            destination, ``source`` the source: each gets those its loader accepts; one
            that applies to neither, read or written, is refused). A fleet job's
            options can be passed as they are.
        ptd: the .ptd of a .pte (default: beside it, when its record names one).
        quick: skip the full read that checks the bytes against the record's SHA-256
            (the report's ``content_checked`` is then False and its message says so).
        xnnpack_cpu: the CPU fingerprint a fleet job's device declares: the XNNPACK
            packed-weight file beside the artifact must have been made for it (a
            missing one is stale). Without it, a file found beside is checked all the
            same (its record bound to this artifact, its size and SHA-256).
        ptd_source: for a ``.pte``, the .ptd source its .ptd should have been made from
            (compared with the record's ``ptd_source``, as ``source`` is with
            ``source``): a fleet job's model's ``ptd``.
        as_planned: compare the sources as ``fleet plan`` does (``verify --job``): by
            the digest ptestore names sources by now (``sha256-tree:``), not by the one
            the record names; a record from before version 3 (``sha256:``) is then
            stale, as the plan makes its pair again.

    Returns:
        A :class:`VerifyReport`: ``status`` ``"intact"``, ``"current"``, ``"stale"`` (each finding
        names its field) or ``"invalid"`` (an artifact that is there and fails its
        checks: corrupt, or a backend that cannot rate it, with ``error``), and
        ``exit_code`` 0, 1 or 2 to match.

    Raises:
        ObjectNotFound: the artifact, or the ``source`` given, does not exist (a .ptd the
            artifact's record names that is missing is a finding: stale).
        ConfigurationError: bad arguments (an unknown backend, a storage option that
            applies to nothing, an artifact that is not a regular file): as every
            other call, not a verdict on the artifact.
        StorageError: a storage failure (``PermissionDenied`` included), among them "changed
            while being verified" when an object read (the artifact, its .ptd, the
            source) was replaced during the check: nothing is said of its bytes, verify
            it again.
    """
    target = _args.path_argument(url, "url")
    _args.path_arguments(source=source, ptd=ptd, ptd_source=ptd_source)
    _args.backends_argument(backends)
    _args.device_argument(device, (DeviceProfile, str))  # or a device's name
    _args.flag_arguments(quick=quick, as_planned=as_planned)
    _args.text_arguments(xnnpack_cpu=xnnpack_cpu)
    report = VerifyReport(target)
    from .journal import recover_if_local

    recover_if_local(target)  # an interrupted in-place specialization: finish it first
    opts = StorageOptions(storage_options)
    try:
        opts.check([x for x in (source, ptd_source) if x is not None], [target])
        _check(report, target, source, backends, device, opts, ptd, quick, as_planned)
        prov = report.provenance
        if ptd_source is not None and prov is not None and prov.role == "pte":
            made = prov.ptd_source
            _compare_source(report, made, ptd_source, "ptd_source.sha256", opts, as_planned)
        if report.provenance is not None and report.provenance.role == "pte":
            from .fleet.packing import check_beside

            found, report.xnnpack = check_beside(target, opts.common, quick=quick, cpu=xnnpack_cpu)
            for field_name, message in found:
                report.stale(field_name, message)
        nothing_given = source is None and backends is None and device is None
        if report.status == "current" and (nothing_given or report.shared):
            report.status = "intact"
    except (FormatError, _Unrated) as exc:  # there, and fails its checks: the verdict
        report.status = "invalid"
        report.error = str(exc)
    except PreconditionFailed as exc:  # a read found another version than it started with
        raise StorageError(
            f"{target}: changed while being verified (verify it again): {exc}"
        ) from exc
    return report


def _check(
    report: VerifyReport,
    target: str,
    source: str | os.PathLike[str] | None,
    backends: Sequence[BackendLike] | None,
    device: DeviceProfile | str | None,
    opts: StorageOptions,
    ptd: str | os.PathLike[str] | None,
    quick: bool,
    planned: bool,
) -> None:
    from .fleet.shared import is_shared_url

    if is_shared_url(target) and is_plain(target, opts):
        check_content_address(report, target, opts, quick)
        report.shared = True  # no record: nothing to compare, at most intact
        return
    prov, _ = read_checked(report, target, opts, quick)
    report.provenance = prov
    if prov.role == "pte" and (ptd is not None or prov.ptd_output is not None):
        check_ptd(report, prov, target, ptd, opts, quick)
    if source is not None:
        made = prov.ptd_source if prov.role == "ptd" else prov.source
        field_name = "ptd_source.sha256" if prov.role == "ptd" else "source.sha256"
        _compare_source(report, made, source, field_name, opts, planned)
    profile = device if isinstance(device, DeviceProfile) else None
    hint = ""
    if backends is not None:
        if profile is None and isinstance(device, str):
            profile, hint = named_profile(device, prov)
        _check_backends(report, prov, backends, profile, hint)
    if device is not None:
        name = device.name if isinstance(device, DeviceProfile) else device
        have = prov.device
        if have is None or have.name != name:
            was = "no device" if have is None else "{was!r}"
            template = f"made for {was}, expected {{name!r}}"
            _stale(report, "device.name", template, was=have and have.name, name=name)
        elif isinstance(device, DeviceProfile) and have.digest != device.digest():
            _stale(
                report,
                "device.digest",
                "device {name!r} options digest is {have}, expected {want} ({changes})",
                name=name,
                have=have.digest,
                want=device.digest(),
                changes=option_changes(have.options, dict(device.options)),
            )


def _compare_source(
    report: VerifyReport,
    made: Any,
    source: str | os.PathLike[str],
    field_name: str,
    opts: StorageOptions,
    planned: bool = False,
) -> None:
    """Stale under ``field_name`` unless ``source`` is the source the record names
    (``made``: its ``source`` or ``ptd_source``, or None) by size and SHA-256: the
    digest the record names, or with ``planned`` the one a fleet plan compares
    (``sha256-tree:``, whatever the record's version)."""
    from .journal import recover_if_local

    src = os.fspath(source)
    recover_if_local(src)  # a source an in-place run left torn: completed, as inspect would
    src_loader = open_loader(src, **opts.for_loader(src, "src"))
    try:
        # The digest of these bytes, read now: not what the source's own trailer says
        # of them (a damaged byte would not be seen), nor what this process knew before.
        like = None if made is None or planned else made.sha256
        info = describe_source(src_loader, like=like, trust_trailer=False)
    finally:
        src_loader.close()
    if made is None or info.sha256 != made.sha256 or info.size != made.size:
        was = "nothing" if made is None else "{url} ({size} bytes, {sha256})"
        template = (
            f"the artifact was made from {was}, not from {{src}} ({{got_size}} bytes, {{got}})"
        )
        if made is not None and made.sha256[:7] != info.sha256[:7]:  # sha256: / sha256-tree:
            template = (
                "the record names {url} by its whole SHA-256 ({sha256}: a record from before "
                "version 3), a fleet plan compares {src} by {got}: it makes the pair again"
            )
        _stale(
            report,
            field_name,
            template,
            url=None if made is None else made.url,
            size=None if made is None else made.size,
            sha256=None if made is None else made.sha256,
            src=src,
            got_size=info.size,
            got=info.sha256,
        )


def _check_backends(
    report: VerifyReport,
    prov: Provenance,
    backends: Sequence[BackendLike],
    device: DeviceProfile | None,
    hint: str = "",
) -> None:
    loaded = [(spec_text(b), load_backend(b)) for b in backends]
    want = [(s, version_of(i, s)) for s, i in loaded]
    have = [(b.spec, b.version) for b in prov.requested]
    if [s for s, _ in want] != [s for s, _ in have]:
        _stale(
            report,
            "backends.spec",
            "made with [{have}], expected [{want}]",
            have=", ".join(s for s, _ in have) or "none",
            want=", ".join(s for s, _ in want) or "none",
        )
        return
    for (spec, version), (_, recorded) in zip(want, have, strict=True):
        if version != recorded:
            _stale(
                report,
                "backends.version",
                "{spec} made it at version {recorded}; the installed version is {version}",
                spec=spec,
                recorded=recorded,
                version=version,
            )
    try:  # the rating a fleet plan asks too (a failure, a sys.exit() included, named)
        ratings = rate_stamps(prov.backends, dict(loaded), device)
    except BackendError as exc:  # no verdict but invalid (the backend's failure named)
        raise _Unrated(str(exc)) from exc
    for r in ratings:
        report.compatibility[r.id] = r.rating
        if r.rating is not Compatibility.OPTIMAL:
            _stale(
                report,
                "backends.compatibility",
                "{spec} rates the {id} data {rating} for "
                + ("no device" if device is None else "{device!r}")
                + " (stamped {stamped!r}){hint}",
                spec=r.spec,
                id=r.id,
                rating=r.rating.value,
                device=None if device is None else device.name,
                stamped=r.stamped,
                hint=hint,
            )


class _Cut(string.Formatter):
    """A finding's template formatted for the text report: each string value cut to
    :data:`~ptestore._text.REPORT_CHARS` (``!r``: quoted, then cut)."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "r":
            return shown(value, REPORT_CHARS)
        if isinstance(value, str):
            return clipped(value)
        return super().convert_field(value, conversion)


def _stale(report: VerifyReport, field_name: str, template: str, **values: Any) -> None:
    """A finding: ``template`` formatted with ``values`` whole (its message: ``--json``)
    and with each string cut (its text line: a record's 1 MB device name, spec or URL
    made a 1 MB line)."""
    # a URL redacted before its string is cut (a cut one may not show its '@' any more)
    values = {k: redact_urls(v) if isinstance(v, str) else v for k, v in values.items()}
    whole = template.format(**values)
    cut = _Cut().format(template, **values)
    report.stale(field_name, whole, None if cut == whole else cut)


def _redacted_or_none(text: str | None) -> str | None:
    return None if text is None else redact_urls(text)
