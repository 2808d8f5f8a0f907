"""The ``xnnpack`` field of an index entry (:mod:`.packed`: the fleet's packed-weight file
of the entry's artifact) as a device reads it: its form (:func:`check_field`), the
identity it claims its file was made for (:func:`identity_claimed`), and why it is no
file for a device (:func:`why_not`).

The index is read from storage the device does not control: every field a delivery
uses is held to the form a fleet writes before any of it is used (a list where an
object goes made an ``AttributeError``, a size as a string an "3968 bytes, the index
names 3968" refusal). ``select`` checks the field it reports (the field of the device's
own CPU); a malformed one is not reported, and ``fetch`` and ``ensure`` treat it as a
delivery that failed (``ensure``: the file is made here).
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError

__all__ = [
    "FIELD_TYPES",
    "KIND_NAMES",
    "check_field",
    "identity_claimed",
    "runtime_build",
    "why_not",
]

_OPTIONAL_STR = (str, type(None))
_OPTIONAL_INT = (int, type(None))
#: The types of the fields of a record's ``xnnpack`` object (the index's field).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "url": _OPTIONAL_STR,
    "size": _OPTIONAL_INT,
    "sha256": _OPTIONAL_STR,
    "entries": _OPTIONAL_INT,
    "cpu": (str,),
    "executorch": (dict,),
    "artifact_sha256": (dict,),
    "refused": _OPTIONAL_STR,
    "chunks_root": _OPTIONAL_STR,
}
#: How a message names each of those types.
KIND_NAMES = {
    _OPTIONAL_STR: "a string or null",
    _OPTIONAL_INT: "an integer or null",
    (str,): "a string",
    (dict,): "an object",
}
_SHA256 = "'sha256:<64 hex digits>'"


def check_field(field: object, source: str, entry: str) -> dict[str, Any]:
    """``field``, the ``xnnpack`` field of ``entry`` (``entry MODEL/DEVICE``) read from
    ``source``, when it has the form a fleet writes: an object whose fields have their
    types (:data:`FIELD_TYPES`; an integer never a bool, never negative), ``sha256``
    and ``artifact_sha256``'s ``pte`` and ``ptd`` SHA-256 digests, ``chunks_root`` a
    ``sha256-tree`` one, ``executorch`` a build (``version`` and ``git_version``
    strings), and a ``url`` with its ``size`` and ``sha256``. Else a
    :class:`FormatError` naming ``source``, the entry, the field and its value.

    A field of :data:`FIELD_TYPES` that may be null and is missing reads as null: a
    fleet from before chunk records (0550530) wrote no ``chunks_root``, and an index
    migrated to version 3, or a cache manifest written then, keeps its field as it was
    (its file is downloaded whole). The field returned then has it, as null (a copy;
    else ``field`` itself)."""
    from ..provenance.chunks import well_formed

    def refuse(name: str, value: object, limit: str) -> FormatError:
        return FormatError(source, f"{entry} xnnpack{name}", value, limit)

    if not isinstance(field, dict):
        raise refuse("", field, "an object or null")
    for name, kinds in FIELD_TYPES.items():
        value = field.get(name)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise refuse(f".{name}", value, KIND_NAMES[kinds])
        if isinstance(value, int) and value < 0:
            raise refuse(f".{name}", value, "an integer >= 0 or null")
    if any(name not in field for name in FIELD_TYPES):  # null, as the loop read it
        field = {**field, **{name: None for name in FIELD_TYPES if name not in field}}
    build = field["executorch"]
    for name in ("version", "git_version"):
        if not isinstance(build.get(name), str):
            raise refuse(f".executorch.{name}", build.get(name), "a string")
    claimed = field["artifact_sha256"]
    for name, optional in (("pte", False), ("ptd", True)):
        value = claimed.get(name)
        if not (optional and value is None) and not well_formed(value, ("sha256",)):
            raise refuse(f".artifact_sha256.{name}", value, _SHA256 + " or null" * optional)
    if field["sha256"] is not None and not well_formed(field["sha256"], ("sha256",)):
        raise refuse(".sha256", field["sha256"], _SHA256 + " or null")
    root = field["chunks_root"]
    if root is not None and not well_formed(root, ("sha256-tree",)):
        raise refuse(".chunks_root", root, "'sha256-tree:<64 hex digits>' or null")
    if field["url"]:
        for name in ("size", "sha256"):
            if field[name] is None:
                raise refuse(f".{name}", None, "given with the url of the file")
    return field


def identity_claimed(field: dict[str, Any]) -> dict[str, Any]:
    """The identity (:meth:`ptestore.xnnpack.Identity.to_json`) an index field says its
    file was made for."""

    def hex_of(value: object) -> object:
        return value[len("sha256:") :] if isinstance(value, str) else value

    artifact = field.get("artifact_sha256") or {}
    build = field.get("executorch") or {}
    return {
        "pte_sha256": hex_of(artifact.get("pte")),
        "ptd_sha256": hex_of(artifact.get("ptd")),
        "executorch_version": build.get("version"),
        "executorch_git": build.get("git_version"),
        "cpu": field.get("cpu"),
    }


def runtime_build() -> dict[str, str] | None:
    """This machine's ExecuTorch build (``{"version", "git_version"}``), None without
    one."""
    from ..errors import ConfigurationError
    from ..xnnpack.native import executorch_build

    try:
        return executorch_build().to_json()
    except ConfigurationError:
        return None


def why_not(
    field: dict[str, Any] | None,
    cpu: str,
    build: dict[str, str] | None,
    *,
    source: str = "index",
) -> str | None:
    """Why the ``source``'s ``field`` (``"index"``, or ``"record"``: the XNNPACK record
    beside an artifact fetched by URL) is no file for a device of fingerprint ``cpu``
    and ExecuTorch ``build`` (``{"version", "git_version"}``; None: not compared), or
    None when it is one."""
    if field is None:
        if source == "record":
            return (
                "no XNNPACK record beside the artifact names a packed-weight file of it "
                "for this CPU"
            )
        return "the index lists no XNNPACK packed-weight file of this artifact for this CPU"
    if field.get("cpu") != cpu:
        return (
            f"the {source}'s packed-weight file was made for the CPU {field.get('cpu')!r}, "
            f"not {cpu!r}"
        )
    if build is not None and field.get("executorch") != build:
        have = field.get("executorch") or {}
        return (
            f"the {source}'s packed-weight file was made with ExecuTorch {have.get('version')} "
            f"({have.get('git_version')}), this device runs {build['version']} "
            f"({build['git_version']})"
        )
    if field.get("refused"):
        return f"the fleet's runtime refused one: {field['refused']}"
    if not field.get("url"):
        return f"the {source}'s packed-weight entry names no file"
    return None
