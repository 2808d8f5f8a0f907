"""Fleet job files (TOML): which models, for which devices, with which backends, to where.

::

    destination = "s3://models/{device}/{model}.pte"   # {model}, {device}; .ptd beside it
    backends = ["mypkg.npu:NpuBackend"]                  # SPECs, as for --backend
    [storage_options]                                     # optional, fsspec style
    endpoint_url = "http://127.0.0.1:9000"
    [[models]]
    name = "mlp"                                          # default: the source's stem
    source = "s3://src/mlp.pte"
    ptd = "s3://src/mlp.ptd"                              # optional
    [devices.pixel9]                                      # one table per device profile
    soc = "sm8650"                                        # any keys: handed to backends
    xnnpack_cpu = "aarch64/page=4096:asimd,asimddp"       # optional: its CPU fingerprint

``xnnpack_cpu`` is not a device option: it asks the run for XNNPACK's packed-weight file
for that CPU beside each of the device's artifacts (:mod:`.packing`), and is not handed
to backends nor part of the device's digest.

``index_version = 2`` (top-level, optional) keeps a version 2 index, one JSON object
(no help to a device that cannot read version 3: a run's records are version 3 too);
by default the index is version 3 wherever the store has compare-and-swap.

Every error is a :class:`JobError` naming the file, the line and the key.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import string
import sys
from typing import Any

from .._dataclass import dataclass, field, replace
from ..backends.compat import DeviceProfile
from ..errors import ConfigurationError
from ..storage.routing import StorageOptions, options_for_loader
from ..storage.types import StorageURL, absolute_local, strerror
from .job_check import SHARED_DIR, destinations_problem, fingerprint_problem, template_root

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "SHARED_DIR",
    "XNNPACK_CPU_KEY",
    "Job",
    "JobError",
    "Model",
    "Pair",
    "check_destinations",
    "load_job",
    "pair_options",
    "parse_job",
    "ptd_beside",
    "template_root",
]

#: The key of a ``[devices.NAME]`` table that declares the device's CPU fingerprint.
XNNPACK_CPU_KEY = "xnnpack_cpu"

_TOP_KEYS = {
    "destination",
    "backends",
    "storage_options",
    "models",
    "devices",
    "index_version",
    "xnnpack_timeout",
}
_MODEL_KEYS = {"name", "source", "ptd"}
_FIELDS = {"model", "device"}


class JobError(ConfigurationError):
    """A job file is malformed: the message names the file, line and key."""


@dataclass(frozen=True)
class Model:
    """One model of a job: its name and where its .pte (and .ptd) are."""

    name: str
    source: str
    ptd: str | None = None


@dataclass(frozen=True)
class Pair:
    """One (model, device) pair and where its artifact goes."""

    model: Model
    device: DeviceProfile
    destination: str
    ptd_destination: str | None
    #: The device's CPU fingerprint, when it asks for XNNPACK's packed-weight file.
    xnnpack_cpu: str | None = None


@dataclass(frozen=True)
class Job:
    """A parsed job file."""

    path: str
    destination: str
    backends: tuple[str, ...]
    models: tuple[Model, ...]
    devices: tuple[DeviceProfile, ...]
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: ``sha256:<hex>`` of the job file's text (recorded in each artifact's provenance).
    sha256: str = ""
    #: Device name -> the CPU fingerprint it declares (``xnnpack_cpu``).
    xnnpack_cpu: dict[str, str] = field(default_factory=dict)
    #: The index version to write (None: version 3 where the store has compare-and-swap).
    index_version: int | None = None
    #: Seconds each run of the XNNPACK runtime's child may take on a worker (None: the
    #: default, :data:`ptestore.xnnpack.refusal.DEFAULT_TIMEOUT`).
    xnnpack_timeout: float | None = None
    #: The job file's absolute path (:func:`load_job`), or "" for a job parsed from
    #: text: what its artifacts' job stamp records (:attr:`stamp_path`), so that the
    #: stamp names the same file from any working directory (``path`` is kept as given,
    #: for messages).
    location: str = ""

    @property
    def stamp_path(self) -> str:
        """The path an artifact's job stamp records: :attr:`location`, else ``path``.
        Never compared by a plan (the provenance key leaves the job out); ``fleet
        retire`` matches it (:func:`.retire.written_by`)."""
        return self.location or self.path

    def pairs(self) -> list[Pair]:
        """Every (model, device) pair, models outer, in file order."""
        out = []
        for m in self.models:
            for d in self.devices:
                dst = self.destination.format(model=m.name, device=d.name)
                ptd = None if m.ptd is None else ptd_beside(dst)
                out.append(Pair(m, d, dst, ptd, self.xnnpack_cpu.get(d.name)))
        return out

    def device(self, name: str) -> DeviceProfile:
        for d in self.devices:
            if d.name == name:
                return d
        raise ConfigurationError(
            f"{self.path}: no device {name!r} (devices: {', '.join(d.name for d in self.devices)})"
        )

    def options_for_loader(self, url: str) -> dict[str, Any]:
        """The job's storage options that apply to reading ``url`` (none for local
        paths), as :mod:`ptestore.storage.routing` routes them."""
        return options_for_loader(url, self.storage_options)

    def options_for_writer(self, url: str) -> dict[str, Any]:
        """The storage options for writing the destination ``url`` (see
        :func:`pair_options`)."""
        return pair_options(url, self.storage_options).for_writer(url)


def pair_options(destination: str, options: dict[str, Any]) -> StorageOptions:
    """The storage options of one pair's run: the job's ``options`` as common ones (each
    reaches every URL that accepts it: :mod:`ptestore.storage.routing`), and the fleet's
    defaults for the destinations: local ones get their ``{device}`` directories made as
    needed; S3 outputs are written once, unspooled, unless the job says otherwise."""
    url = StorageURL.of(destination)
    defaults: dict[str, Any] = {}
    if url.local:
        defaults["auto_mkdir"] = True
    elif url.protocol == "s3" and "spool" not in options:
        defaults["spool"] = False
    return StorageOptions(options, dst=defaults)


def ptd_beside(destination: str) -> str:
    """``.../x.pte`` -> ``.../x.ptd`` (any other name gets ``.ptd`` appended)."""
    return destination[:-4] + ".ptd" if destination.endswith(".pte") else destination + ".ptd"


def _line_of(text: str, table: str | None, key: str | None, index: int | None = None) -> int:
    """1-based line of ``key`` in ``table`` (``None`` = top level; ``models`` with
    ``index`` = the index-th ``[[models]]``), or of the table header; 0 if not found."""
    current: str | None = None
    seen = -1
    header_line = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = re.match(r"^\[\[\s*([^\]]+?)\s*\]\]", line) or re.match(r"^\[\s*([^\]]+?)\s*\]", line)
        if m:
            current = m.group(1).replace('"', "").replace("'", "")
            if current == table:
                seen += 1
                if index is None or seen == index:
                    header_line = no
            continue
        in_table = current == table and (index is None or seen == index)
        if in_table and key is not None and re.match(rf"^[\"']?{re.escape(key)}[\"']?\s*=", line):
            return no
    return header_line


def load_job(path: str | os.PathLike[str]) -> Job:
    """Read and check a job file."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise JobError(f"{p}: job file not found") from None
    except OSError as exc:
        raise JobError(f"{p}: cannot read the job file: {strerror(exc)}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobError(f"{p}: not UTF-8 text at byte {exc.start}") from None
    return replace(parse_job(text, p), location=os.path.abspath(p))


_NUL = "contains a NUL byte ('\\x00'): no path or URL can hold one"


def parse_job(text: str, path: str = "<job>") -> Job:
    """Parse job TOML ``text`` (``path`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise JobError(
            f"{path}: invalid TOML: arrays or tables nested deeper than the parser can read"
        ) from None

    def fail(
        message: str, table: str | None, key: str | None, index: int | None = None
    ) -> JobError:
        line = _line_of(text, table, key, index)
        where = f"{path}:{line}" if line else path
        name = ".".join(x for x in (table, key) if x) or "(top level)"
        if index is not None and table == "models":
            name = f"models[{index}]" + (f".{key}" if key else "")
        return JobError(f"{where}: {name}: {message}")

    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise fail(f"unknown key (accepted: {', '.join(sorted(_TOP_KEYS))})", None, unknown[0])
    dest = data.get("destination")
    if not isinstance(dest, str) or not dest.strip():
        raise fail(
            "required: a destination template string such as 's3://bucket/{device}/{model}.pte'",
            None,
            "destination",
        )
    if "\x00" in dest:
        raise fail(_NUL, None, "destination")
    names = _template_fields(dest, lambda m: fail(m, None, "destination"))
    if names - _FIELDS or not {"model", "device"} <= names:
        raise fail(
            f"the template {dest!r} must use {{model}} and {{device}} and no other field "
            f"(found: {', '.join(sorted(names)) or 'none'})",
            None,
            "destination",
        )
    backends = data.get("backends", [])
    if not isinstance(backends, list) or not all(
        isinstance(b, str) and b.strip() for b in backends
    ):
        raise fail("must be a list of backend SPEC strings", None, "backends")
    options = data.get("storage_options", {})
    if not isinstance(options, dict):
        raise fail("must be a table", None, "storage_options")
    models_raw = data.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise fail("at least one [[models]] table is required", None, "models")
    models: list[Model] = []
    for i, m in enumerate(models_raw):
        if not isinstance(m, dict):
            raise fail("must be a table", "models", None, i)
        bad = sorted(set(m) - _MODEL_KEYS)
        if bad:
            raise fail(
                f"unknown key (accepted: {', '.join(sorted(_MODEL_KEYS))})", "models", bad[0], i
            )
        src = m.get("source")
        if not isinstance(src, str) or not src.strip():
            raise fail("required: the URL or path of the model's .pte", "models", "source", i)
        ptd = m.get("ptd")
        if ptd is not None and (not isinstance(ptd, str) or not ptd.strip()):
            raise fail("must be the URL or path of the model's .ptd", "models", "ptd", i)
        for field_name, given in (("source", src), ("ptd", ptd)):
            if given is not None and "\x00" in given:
                raise fail(_NUL, "models", field_name, i)
        name = m.get("name")
        if name is None:
            name = os.path.splitext(os.path.basename(src.rstrip("/")))[0]
        if not isinstance(name, str) or not _plain_name(name):
            raise fail(
                f"{name!r}: a model name may use letters, digits, '.', '_' and '-' "
                "and may not be '.' or '..'",
                "models",
                "name",
                i,
            )
        if any(x.name == name for x in models):
            raise fail(f"duplicate model name {name!r}", "models", "name", i)
        models.append(Model(name, src, ptd))
    devices_raw = data.get("devices")
    if not isinstance(devices_raw, dict) or not devices_raw:
        raise fail("at least one [devices.NAME] table is required", None, "devices")
    devices: list[DeviceProfile] = []
    cpus: dict[str, str] = {}
    for dname, opts in devices_raw.items():
        table = f"devices.{dname}"
        if not _plain_name(dname):
            raise fail(
                f"{dname!r}: a device name may use letters, digits, '.', '_' and '-' "
                "and may not be '.' or '..'",
                table,
                None,
            )
        if not isinstance(opts, dict):
            raise fail("must be a table of options", "devices", dname)
        opts = dict(opts)
        if XNNPACK_CPU_KEY in opts:
            cpu = opts.pop(XNNPACK_CPU_KEY)
            problem = fingerprint_problem(cpu)
            if problem:
                raise fail(problem, table, XNNPACK_CPU_KEY)
            cpus[dname] = cpu
        non_finite = _non_finite(opts)
        if non_finite is not None:
            key, value = non_finite
            raise fail(
                f"{value!r}: device {dname!r} option {key!r} must be a finite number "
                "(trailers and the index are JSON, which has no nan or inf)",
                table,
                key.split(".", 1)[0].split("[", 1)[0],
            )
        devices.append(DeviceProfile(dname, _plain(opts)))
    version = data.get("index_version")
    if version is not None and (type(version) is not int or version not in (2, 3)):
        raise fail("must be 2 or 3 (the index version to write)", None, "index_version")
    timeout = data.get("xnnpack_timeout")
    if timeout is not None and (
        type(timeout) not in (int, float) or not 0 < timeout < float("inf")
    ):
        raise fail(
            f"{timeout!r}: must be a number of seconds > 0 (each run of the XNNPACK "
            "runtime's child on a worker; default 3600)",
            None,
            "xnnpack_timeout",
        )
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    job = Job(
        path,
        dest,
        tuple(backends),
        tuple(models),
        tuple(devices),
        dict(options),
        digest,
        cpus,
        version,
        None if timeout is None else float(timeout),
    )
    if any(m.ptd for m in models) and not dest.endswith(".pte"):
        raise fail(
            "must end with .pte when a model has a .ptd (it goes beside the .pte)",
            None,
            "destination",
        )
    problem = check_destinations(job)
    if problem:
        raise fail(problem, None, "destination")
    return replace(job, destination=absolute_local(dest))  # the index names absolute files


def _plain_name(name: str) -> bool:
    """A model or device name is one plain path segment: never path syntax."""
    return bool(re.fullmatch(r"[A-Za-z0-9._-]+", name)) and name not in (".", "..")


def _template_fields(dest: str, fail: Any) -> set[str]:
    """The fields of the destination template; only bare ``{model}`` and ``{device}``
    (no format spec, no conversion, no attribute or index) are accepted."""
    try:
        parsed = list(string.Formatter().parse(dest))
    except ValueError as exc:
        raise fail(f"the template {dest!r} is not a valid template: {exc}") from None
    names: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise fail(
                f"the template {dest!r} uses {shown}: only bare fields {{model}} and "
                "{device} are accepted (no format spec or conversion)"
            )
        names.add(name)
    return names


def check_destinations(job: Job) -> str | None:
    """Why the job's destinations are unsafe, or None (:mod:`.job_check`): two that are
    one stored object (as the store addresses them), one that is a source or outside the
    template's root, one named as the job's own objects are (``_shared/``, the index,
    XNNPACK's files, ...), or one too long for its store."""
    from .job_check import names_problem

    sources = [s for m in job.models for s in (m.source, m.ptd) if s is not None]
    pairs = [
        (f"({p.model.name}, {p.device.name})", (p.destination, p.ptd_destination), p.xnnpack_cpu)
        for p in job.pairs()
    ]
    return destinations_problem(job.destination, sources, pairs) or names_problem(pairs)


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """``(key, value)`` of the first float in ``value`` that is nan or infinite (a key
    such as ``a.b[2]``), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else ()
    for k, v in items:
        found = _non_finite(v, f"{where}.{k}" if where else str(k))
        if found:
            return found
    for i, v in enumerate(value if isinstance(value, list) else ()):
        found = _non_finite(v, f"{where}[{i}]")
        if found:
            return found
    return None


def _plain(value: Any) -> Any:
    """TOML values as JSON values (dates become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
