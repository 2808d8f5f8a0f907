"""Storage options checked at the edge: names that apply, values of the right type.

``open_loader`` and ``open_writer`` call :func:`check_options` before anything is
built, so a misspelt or misplaced option fails at once with a
:class:`~ptestore.errors.ConfigurationError` listing the accepted names, and a value of
the wrong type names the option, the value and what it must be.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from ..errors import ConfigurationError

__all__ = ["check_options", "fsspec_options"]


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_bool(v: object) -> bool:
    return isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_dict(v: object) -> bool:
    return isinstance(v, dict)


def _is_path(v: object) -> bool:
    return isinstance(v, (str, os.PathLike))


#: Types of the options ptestore and s3fs document, as (check, what it must be, None ok).
_TYPES: dict[str, tuple[Callable[[object], bool], str, bool]] = {
    # s3fs connection options
    "endpoint_url": (_is_str, "a str (URL)", True),
    "key": (_is_str, "a str", True),
    "secret": (_is_str, "a str", True),
    "token": (_is_str, "a str", True),
    "username": (_is_str, "a str", True),
    "password": (_is_str, "a str", True),
    "profile": (_is_str, "a str (profile name)", True),
    "anon": (_is_bool, "a bool", False),
    "use_ssl": (_is_bool, "a bool", False),
    "requester_pays": (_is_bool, "a bool", False),
    "client_kwargs": (_is_dict, "a dict (botocore client arguments)", True),
    "config_kwargs": (_is_dict, "a dict (botocore Config arguments)", True),
    "s3_additional_kwargs": (_is_dict, "a dict (extra S3 request parameters)", True),
    # ptestore options
    "part_size": (_is_int, "an int (bytes)", False),
    "max_concurrency": (_is_int, "an int", False),
    "retry_attempts": (_is_int, "an int", False),
    "retry_initial": (_is_number, "a number (seconds)", False),
    "retry_max": (_is_number, "a number (seconds)", False),
    "metadata": (_is_dict, "a dict of str to str", True),
    "spool": (_is_bool, "a bool", False),
    "spool_dir": (_is_path, "a str or path", True),
    "verify": (_is_bool, "a bool", False),
    "checksum_algorithm": (_is_str, "a str (CRC64NVME, CRC32 or CRC32C)", True),
    "durable": (_is_bool, "a bool", False),
    "auto_mkdir": (_is_bool, "a bool", False),
}


def check_options(
    url: str, options: Mapping[str, object], accepted: Iterable[str], applies_to: str
) -> None:
    """Refuse options outside ``accepted`` and known options of the wrong type."""
    names = frozenset(accepted)
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigurationError(
            f"{url}: options {unknown} do not apply to {applies_to} (accepted: {sorted(names)})"
        )
    for name, value in options.items():
        spec = _TYPES.get(name)
        if spec is None:
            continue
        check, must, none_ok = spec
        if value is None and none_ok:
            continue
        if not check(value):
            raise ConfigurationError(f"{url}: option {name} = {value!r}: must be {must}")


#: Options every fsspec filesystem takes (instance cache and listings cache).
_FSSPEC_BASE_OPTIONS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)
#: Options that s3fs passes on to ``aiobotocore.session.AioSession``.
_S3FS_SESSION_OPTIONS = frozenset({"profile"})


def fsspec_options(fs_cls: type) -> frozenset[str]:
    """Options an fsspec filesystem class takes: the named parameters of the
    ``__init__`` of each class up to ``AbstractFileSystem``, fsspec's common options,
    and for s3fs the session options it forwards."""
    import inspect  # here: a local run never asks (start-up is measured on devices)

    names = set(_FSSPEC_BASE_OPTIONS)
    for cls in fs_cls.__mro__:
        if cls.__name__ == "AbstractFileSystem" or cls is object:
            break
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                names.add(p.name)
    if getattr(fs_cls, "protocol", None) in ("s3", ("s3", "s3a")):
        names |= _S3FS_SESSION_OPTIONS
    names.discard("asynchronous")  # ptestore calls filesystems synchronously
    names.discard("loop")
    return frozenset(names)
