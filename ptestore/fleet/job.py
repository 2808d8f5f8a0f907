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

Every error is a :class:`JobError` naming the file, the line and the key.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
import sys
from dataclasses import dataclass, field
from typing import Any

from ..backends.compat import DeviceProfile
from ..errors import ConfigurationError
from ..loaders import split_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "WRITER_ONLY_OPTIONS",
    "Job",
    "JobError",
    "Model",
    "Pair",
    "load_job",
    "loader_options",
    "parse_job",
    "ptd_beside",
    "writer_options",
]

_TOP_KEYS = {"destination", "backends", "storage_options", "models", "devices"}
_MODEL_KEYS = {"name", "source", "ptd"}
_FIELDS = {"model", "device"}
#: Options only writers understand; loaders do not get them.
WRITER_ONLY_OPTIONS = frozenset(
    {
        "part_size",
        "max_concurrency",
        "metadata",
        "spool",
        "spool_dir",
        "verify",
        "durable",
        "auto_mkdir",
        "retry_attempts",
        "retry_initial",
        "retry_max",
    }
)


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

    def pairs(self) -> list[Pair]:
        """Every (model, device) pair, models outer, in file order."""
        out = []
        for m in self.models:
            for d in self.devices:
                dst = self.destination.format(model=m.name, device=d.name)
                out.append(Pair(m, d, dst, None if m.ptd is None else ptd_beside(dst)))
        return out

    def device(self, name: str) -> DeviceProfile:
        for d in self.devices:
            if d.name == name:
                return d
        raise ConfigurationError(
            f"{self.path}: no device {name!r} (devices: {', '.join(d.name for d in self.devices)})"
        )

    def loader_options(self, url: str) -> dict[str, Any]:
        """Storage options for reading ``url`` (none for local paths)."""
        return loader_options(url, self.storage_options)

    def writer_options(self, url: str) -> dict[str, Any]:
        """Storage options for writing ``url``."""
        return writer_options(url, self.storage_options)


def loader_options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """The job's storage ``options`` that apply to reading ``url``: none for local
    paths, and never the writer-only ones."""
    if split_url(url)[0] == "file":
        return {}
    return {k: v for k, v in options.items() if k not in WRITER_ONLY_OPTIONS}


def writer_options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """The job's storage ``options`` for writing ``url`` (local destinations get their
    ``{device}`` directories made as needed; S3 outputs are written once, unspooled)."""
    protocol = split_url(url)[0]
    if protocol == "file":
        return {"auto_mkdir": True}
    opts = dict(options)
    if protocol == "s3":
        opts.setdefault("spool", False)
    return opts


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
        raise JobError(f"{p}: cannot read the job file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobError(f"{p}: not UTF-8 text at byte {exc.start}") from None
    return parse_job(text, p)


def parse_job(text: str, path: str = "<job>") -> Job:
    """Parse job TOML ``text`` (``path`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{path}: invalid TOML: {exc}") from None

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
    names = {f for _, f, _, _ in string.Formatter().parse(dest) if f is not None}
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
        name = m.get("name")
        if name is None:
            name = os.path.splitext(os.path.basename(src.rstrip("/")))[0]
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise fail(
                f"{name!r}: a model name may use letters, digits, '.', '_' and '-'",
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
    for dname, opts in devices_raw.items():
        table = f"devices.{dname}"
        if not re.fullmatch(r"[A-Za-z0-9._-]+", dname):
            raise fail(
                f"{dname!r}: a device name may use letters, digits, '.', '_' and '-'", table, None
            )
        if not isinstance(opts, dict):
            raise fail("must be a table of options", "devices", dname)
        devices.append(DeviceProfile(dname, _plain(opts)))
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    job = Job(path, dest, tuple(backends), tuple(models), tuple(devices), dict(options), digest)
    if any(m.ptd for m in models) and not dest.endswith(".pte"):
        raise fail(
            "must end with .pte when a model has a .ptd (it goes beside the .pte)",
            None,
            "destination",
        )
    seen: dict[str, Pair] = {}
    for pair in job.pairs():
        if pair.destination in seen:
            other = seen[pair.destination]
            raise fail(
                f"pairs ({other.model.name}, {other.device.name}) and "
                f"({pair.model.name}, {pair.device.name}) share the destination "
                f"{pair.destination}",
                None,
                "destination",
            )
        seen[pair.destination] = pair
    return job


def _plain(value: Any) -> Any:
    """TOML values as JSON values (dates become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
