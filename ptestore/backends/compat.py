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
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..errors import ConfigurationError
from .frozen import freeze, thaw
from .snapshot import active as active_snapshot
from .versions import version_of  # re-exported: where callers have always found it

if TYPE_CHECKING:
    from importlib.metadata import Distribution

__all__ = [
    "MAX_OPTIONS_DEPTH",
    "Compatibility",
    "DeviceProfile",
    "canonical_json",
    "distribution_version",
    "parse_device_options",
    "version_of",
]

#: Version reported for a class no installed distribution provides.
UNKNOWN_VERSION = "unknown"
#: Levels of lists and tables a device's options may nest (the options mapping is
#: level 1): provenance records them, and a reader refuses deeper records.
MAX_OPTIONS_DEPTH = 32


class Compatibility(enum.Enum):
    """A backend's rating of an existing artifact for a device."""

    #: The artifact is the best this backend can make for the device.
    OPTIMAL = "optimal"
    #: It runs, but specializing again (newer compiler, other flags) would be better.
    PREFER_RESPECIALIZATION = "prefer_respecialization"
    #: It does not run on the device (or the backend cannot tell that it does).
    UNSUPPORTED = "unsupported"


def _nesting(value: object) -> int:
    """Levels of mappings and lists/tuples in ``value`` (walked without recursion; at
    most ``MAX_OPTIONS_DEPTH + 1``: deeper is not looked at)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: list[object] = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_OPTIONS_DEPTH:  # deeper is refused: no need to go on
            stack.extend((c, depth + 1) for c in children)
    return deepest


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no spaces: the same value always gives the same text.
    Standard JSON only: a nan or an infinity raises ``ValueError`` (other readers of a
    trailer or an index, jq or a JSON parser in another language, refuse them)."""
    import json

    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


#: Why JSON has no room for a value, at the end of messages refusing one.
_JSON_ONLY = "trailers and the index are JSON, which has no nan or inf"


def _int_digits_limit() -> int:
    """The most digits Python turns an int into text with (0: no limit)."""
    import sys

    get = getattr(sys, "get_int_max_str_digits", None)
    return int(get()) if get is not None else 0


def _unfit(device: str, value: object, where: str = "") -> str | None:
    """Why an option value cannot be recorded as JSON (a message naming the option,
    ``a.b[2]`` as a fleet job names it), or None: a nan or an infinity, an int of more
    digits than Python turns into text, a key that is not a string."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return (
            f"device {device!r} option {where!r} must be a finite number, got {value!r} "
            f"({_JSON_ONLY})"
        )
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            str(value)
        except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
            limit = _int_digits_limit()
            return (
                f"device {device!r} option {where!r} is an integer of more than {limit} "
                "digits, which Python does not turn into text "
                "(sys.get_int_max_str_digits()): give it as a string"
            )
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return (
                    f"device {device!r} option {f'{where}.{k}' if where else str(k)!r}: keys "
                    f"must be strings, got {type(k).__name__} {k!r} (JSON's are)"
                )
            found = _unfit(device, v, f"{where}.{k}" if where else k)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _unfit(device, v, f"{where}[{i}]")
            if found:
                return found
    return None


@dataclass(frozen=True, eq=True)
class DeviceProfile:
    """A device type to specialize for: ``name`` and free-form ``options``.

    Options are JSON values (strings, numbers, booleans, lists, tables); they are
    copied, deeply read-only (:mod:`.frozen`: a change raises ``TypeError``), so a profile
    never changes after it is made: not by its caller, not by a backend it is given to.
    """

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError(f"device name must be a non-empty string, got {self.name!r}")
        if "\x00" in self.name:
            raise ConfigurationError(
                f"device name {self.name!r} contains a NUL character (\\x00): programs get "
                "it as text (the command backend's PTESTORE_DEVICE), which cannot hold one"
            )
        if not isinstance(self.options, Mapping):
            raise ConfigurationError(
                f"device {self.name!r}: options must be a mapping, got "
                f"{type(self.options).__name__}"
            )
        if _nesting(self.options) > MAX_OPTIONS_DEPTH:
            raise ConfigurationError(
                f"device {self.name!r}: options nest more than {MAX_OPTIONS_DEPTH} levels "
                "of lists and tables (provenance records them as JSON)"
            )
        unfit = _unfit(self.name, self.options)
        if unfit is not None:
            raise ConfigurationError(unfit)
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

        object.__setattr__(self, "options", freeze(json.loads(text)))

    def __hash__(self) -> int:
        return hash((self.name, canonical_json(dict(self.options))))

    def __copy__(self) -> DeviceProfile:
        return self  # it never changes (a deep copy of its options would be mutable)

    def __deepcopy__(self, memo: dict[int, Any]) -> DeviceProfile:
        return self

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
        return {"name": self.name, "options": thaw(self.options), "digest": self.digest()}


def _strict_json(value: str) -> Any:
    """``json.loads(value)``, or ``ValueError`` when it is not JSON; a number JSON
    cannot hold (``NaN``, ``Infinity``, ``1e999``, an integer of more digits than Python
    converts) raises :class:`ConfigurationError` saying so (only once the whole text
    parsed: ``NaNa`` is not JSON, so a string)."""
    import json
    import math

    unfit: list[str] = []

    def constant(text: str) -> float:
        unfit.append(f"{text} is not a finite number ({_JSON_ONLY})")
        return 0.0

    def real(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):
            unfit.append(f"{text} is not a finite number ({_JSON_ONLY})")
        return number

    def integer(text: str) -> int:
        try:
            return int(text)
        except ValueError:  # more digits than Python turns into a number
            unfit.append(
                f"an integer of {len(text.lstrip('-'))} digits is more than Python converts "
                f"({_int_digits_limit()} digits, sys.get_int_max_str_digits()): give it as "
                "a JSON string (KEY='\"...\"') to keep it as text"
            )
            return 0

    parsed = json.loads(value, parse_constant=constant, parse_float=real, parse_int=integer)
    if unfit:
        raise ConfigurationError(unfit[0])
    return parsed


def parse_device_options(pairs: list[str], where: str = "--device-option") -> dict[str, Any]:
    """``["soc=sm8650", "threads=4"]`` -> ``{"soc": "sm8650", "threads": 4}`` (a value is
    parsed as JSON when it is valid JSON, else kept as a string). Standard JSON only:
    ``NaN``, ``Infinity`` or a number out of range (``1e999``, an integer of more than
    4300 digits) is refused, not kept as a string."""
    if not pairs:
        return {}
    options: dict[str, Any] = {}
    for text in pairs:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{where}: expected KEY=VALUE, got {text!r}")
        try:
            parsed: Any = _strict_json(value)
        except ConfigurationError as exc:
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise ConfigurationError(f"{where} {shown!r}: {exc}") from None
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
    found = _scan_dist_info(top)
    if found is not None:
        return found or UNKNOWN_VERSION
    # An ``*.egg-info`` without ``top_level.txt`` might provide it: decided as
    # importlib.metadata decides (its import alone costs a CLI run about 45 ms, which is
    # why it is the last resort).
    from importlib import metadata

    try:
        dist: Distribution | None = metadata.distribution(top)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None and _provides(dist, top):
        return dist.version
    for name in metadata.packages_distributions().get(top, []):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return UNKNOWN_VERSION


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _scan_dist_info(top: str) -> str | None:
    """The version of the distribution on ``sys.path`` that installs ``top``: the one
    named as ``top`` first (as ``importlib.metadata.distribution(top)`` finds it), else
    the first that declares it (``*.dist-info``: its ``top_level.txt``, else the
    top-level names in its ``RECORD``; ``*.egg-info``: its ``top_level.txt`` and
    ``PKG-INFO``); ``""`` when none does, None when an egg-info without
    ``top_level.txt`` might (then importlib.metadata decides). A few small files per
    distribution, without importing ``importlib.metadata`` or parsing each one's
    metadata: a backend module no distribution provides (on ``PYTHONPATH``) cost a CLI
    run 0.3-0.9 s that way."""
    import os
    import sys

    # (path, directory name, whether ``top`` is installed beside it): a RECORD lists
    # files installed under its own sys.path entry, so where neither ``top/`` nor
    # ``top.py`` is, no RECORD there names it and none is read (torch's is 2 MB).
    infos: list[tuple[str, str, bool]] = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        beside = top in names or f"{top}.py" in names
        infos.extend(
            (os.path.join(entry or ".", name), name, beside)
            for name in names
            if name.endswith((".dist-info", ".egg-info"))
        )
    wanted = _normalized(top)
    named = [info for info in infos if _normalized(_dist_name(info[1])) == wanted]
    unsure = False
    for path, name, beside in named + infos:
        if name.endswith(".egg-info"):
            tops = _read(path, "top_level.txt")
            if tops is None:
                unsure = True
            elif top in tops.split():
                return _field(_read(path, "PKG-INFO"), "Version") or UNKNOWN_VERSION
        elif _dist_info_provides(path, top, record=beside):
            # METADATA's, as importlib.metadata reads it (an editable project's
            # egg_info rewrites it in place); the directory's name where it has none
            stem = name[: -len(".dist-info")]
            version = _field(_read(path, "METADATA"), "Version")
            return version or stem.partition("-")[2] or UNKNOWN_VERSION
    return None if unsure else ""


def _dist_name(directory: str) -> str:
    """``acme_npu-2.5.1.dist-info`` -> ``acme_npu``; ``legacy.egg-info`` -> ``legacy``."""
    return directory.rpartition(".")[0].partition("-")[0]


def _field(text: str | None, name: str) -> str:
    """A header's value in a ``METADATA``/``PKG-INFO`` text (``""`` if absent)."""
    for line in (text or "").splitlines():
        if not line.strip():  # the headers end at the first blank line
            break
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def _read(directory: str, name: str) -> str | None:
    import os

    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _dist_info_provides(path: str, top: str, *, record: bool = True) -> bool:
    """Whether the ``*.dist-info`` at ``path`` installs ``top``: its ``top_level.txt``
    when it declares names, else (``record``) whether its ``RECORD`` lists ``top/...``
    or ``top.py`` (a substring test: a module name has no ``/``, ``,`` or newline)."""
    declared = (_read(path, "top_level.txt") or "").split()
    if declared:
        return top in declared
    if not record:
        return False
    listed = "\n" + (_read(path, "RECORD") or "")
    return f"\n{top}/" in listed or f"\n{top}.py," in listed


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
