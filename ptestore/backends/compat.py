"""Device profiles, backend versions and compatibility ratings (as ONNX Runtime's
compile API rates a compiled model for an execution-provider device).

- :class:`DeviceProfile`: the device a run specializes for: a name and an options
  mapping (SoC, compiler flags, whatever a job says), handed to backends as
  ``BackendDataInitContext.device``; its :meth:`~DeviceProfile.digest` goes into an
  artifact's provenance.
- :class:`Compatibility`: how well an artifact fits a device, as rated by
  ``BackendInterface.check_compatibility(info, device)`` from the compatibility string
  the backend stamped with ``compatibility_info(context)`` when it made the artifact.
- :func:`distribution_version`: the version of the installed distribution that
  provides a class (the default ``BackendInterface.version``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .snapshot import active as active_snapshot

if TYPE_CHECKING:
    from importlib.metadata import Distribution

__all__ = [
    "Compatibility",
    "DeviceProfile",
    "canonical_json",
    "distribution_version",
    "parse_device_options",
]

#: Version reported for a class no installed distribution provides.
UNKNOWN_VERSION = "unknown"


class Compatibility(enum.Enum):
    """A backend's rating of an existing artifact for a device."""

    #: The artifact is the best this backend can make for the device.
    OPTIMAL = "optimal"
    #: It runs, but specializing again (newer compiler, other flags) would be better.
    PREFER_RESPECIALIZATION = "prefer_respecialization"
    #: It does not run on the device (or the backend cannot tell that it does).
    UNSUPPORTED = "unsupported"


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no spaces: the same value always gives the same text."""
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, eq=True)
class DeviceProfile:
    """A device type to specialize for: ``name`` and free-form ``options``.

    Options are JSON values (strings, numbers, booleans, lists, tables); they are
    copied, so a profile never changes after it is made.
    """

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError(f"device name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.options, Mapping):
            raise ConfigurationError(
                f"device {self.name!r}: options must be a mapping, got "
                f"{type(self.options).__name__}"
            )
        try:
            text = canonical_json(dict(self.options))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"device {self.name!r}: options must be JSON values: {exc}"
            ) from exc
        # Recorded in provenance (JSON, UTF-8): a lone surrogate (e.g. a non-UTF-8
        # command-line byte) cannot be; refused here, before any work.
        for what, value in (("name is", self.name), ("options are", text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ConfigurationError(
                    f"device {self.name!r}: the {what} not valid UTF-8 text (character "
                    f"{value[exc.start]!r} at index {exc.start}): provenance records it as JSON"
                ) from None
        import json  # here, not at import time: start-up is measured on devices

        object.__setattr__(self, "options", json.loads(text))

    def __hash__(self) -> int:
        return hash((self.name, canonical_json(dict(self.options))))

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of the options (not of the name)."""
        import hashlib

        text = canonical_json(dict(self.options)).encode()
        return "sha256:" + hashlib.sha256(text).hexdigest()

    def environment(self) -> dict[str, str]:
        """The profile as environment variables (what the ``command`` backend passes):
        ``PTESTORE_DEVICE``, ``PTESTORE_DEVICE_OPTIONS`` (JSON) and
        ``PTESTORE_DEVICE_DIGEST``."""
        return {
            "PTESTORE_DEVICE": self.name,
            "PTESTORE_DEVICE_OPTIONS": canonical_json(dict(self.options)),
            "PTESTORE_DEVICE_DIGEST": self.digest(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "options": dict(self.options), "digest": self.digest()}


def parse_device_options(pairs: list[str], where: str = "--device-option") -> dict[str, Any]:
    """``["soc=sm8650", "threads=4"]`` -> ``{"soc": "sm8650", "threads": 4}`` (a value is
    parsed as JSON when it is valid JSON, else kept as a string)."""
    if not pairs:
        return {}
    import json

    options: dict[str, Any] = {}
    for text in pairs:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{where}: expected KEY=VALUE, got {text!r}")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        options[key.strip()] = parsed
    return options


def _provides(dist: Distribution, top: str) -> bool:
    """Whether ``dist`` installs the top-level module or package ``top``: as
    ``importlib.metadata.packages_distributions`` decides it (the names its
    ``top_level.txt`` declares, else the top-level names of its ``.py`` files)."""
    declared = (dist.read_text("top_level.txt") or "").split()
    if declared:
        return top in declared
    for f in dist.files or ():
        if f.suffix == ".py" and (f.parts[0] if len(f.parts) > 1 else f.stem) == top:
            return True
    return False


@lru_cache(maxsize=256)
def _top_distribution_version(top: str) -> str:
    from importlib import metadata

    # Most distributions are named as their top-level package: that one, when it does
    # provide the package, is found by name (one directory listing per sys.path entry)
    # instead of reading the file list of every installed distribution (about 100 ms).
    try:
        dist: Distribution | None = metadata.distribution(top)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None and _provides(dist, top):
        return dist.version
    found = _scan_dist_info(top)
    if found is not None:
        return found or UNKNOWN_VERSION
    names = metadata.packages_distributions().get(top, [])
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return UNKNOWN_VERSION


def _scan_dist_info(top: str) -> str | None:
    """The version of the first distribution on ``sys.path`` that installs ``top``
    (``*.dist-info``: its ``top_level.txt``, else the top-level names in its
    ``RECORD``, the version from the directory's name; ``*.egg-info``: its
    ``top_level.txt`` and ``PKG-INFO``): ``""`` when none does, None when an egg-info
    without ``top_level.txt`` might (then ``packages_distributions`` decides). Reading a
    few small files per distribution instead of parsing each one's metadata: a backend
    module no distribution provides (on ``PYTHONPATH``) cost a CLI run 0.3-0.9 s
    otherwise."""
    import os
    import sys

    unsure = False
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            path = os.path.join(entry or ".", name)
            if name.endswith(".egg-info"):
                tops = _read(path, "top_level.txt")
                if tops is None:
                    unsure = True
                elif top in tops.split():
                    info = _read(path, "PKG-INFO") or ""
                    for line in info.splitlines():
                        if line.startswith("Version:"):
                            return line.partition(":")[2].strip() or UNKNOWN_VERSION
                    return UNKNOWN_VERSION
            elif name.endswith(".dist-info") and top in _dist_info_tops(path):
                stem = name[: -len(".dist-info")]
                return stem.partition("-")[2] or UNKNOWN_VERSION
    return None if unsure else ""


def _read(directory: str, name: str) -> str | None:
    import os

    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _dist_info_tops(path: str) -> set[str]:
    def read(name: str) -> str | None:
        return _read(path, name)

    declared = read("top_level.txt")
    if declared and declared.split():
        return set(declared.split())
    tops: set[str] = set()
    for line in (read("RECORD") or "").splitlines():
        file = line.partition(",")[0]
        parts = file.split("/")
        if len(parts) > 1 and not parts[0].endswith((".dist-info", ".data")):
            tops.add(parts[0])
        elif len(parts) == 1 and file.endswith(".py"):
            tops.add(file[: -len(".py")])
    return tops


def distribution_version(cls: type) -> str:
    """The version of the installed distribution providing ``cls``'s module, or
    ``"unknown"``: the distribution named as the module's top-level package when it
    provides that package, else the first installed distribution that does.

    Inside :func:`ptestore.backends.snapshot.using`, a current snapshot answers without
    reading any metadata."""
    top = str(cls.__module__).partition(".")[0]
    if top in ("__main__", "builtins"):
        return UNKNOWN_VERSION
    if top == "ptestore":  # ours: the version is in the code, no metadata to read
        from .._version import __version__

        return __version__
    snap = active_snapshot()
    if snap is not None and top in snap.versions:
        return snap.versions[top]
    version = _top_distribution_version(top)
    if snap is not None:
        snap.learn_version(top, version)
    return version
