"""Describe a .pte or .ptd as JSON-ready data (:func:`describe`, what ``ptestore inspect
--json`` prints) or a readable table (:func:`render_table`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ._text import REPORT_CHARS, clipped, printable, shown
from .errors import FormatError
from .format.model import Container, inferred_alignment
from .format.summary import NamedRow, header_json, key_rows, size_warnings, waste
from .format.users import segment_users as segment_records

__all__ = [
    "describe",
    "describe_container",
    "describe_files",
    "key_rows",
    "read_description",
    "read_files",
    "size_warnings",
    "render_files",
    "render_table",
    "segment_users",
    "waste",
]


def segment_users(c: Container) -> dict[int, list[str]]:
    """Who references each segment, as labels (``key K``, ``delegate forward[0] ID``,
    ``constant data``, ``mutable data I``), with an entry (maybe empty) for every segment:
    this module's public name, kept as it was; the walk itself is
    :func:`ptestore.format.users.segment_users` (``segment_records`` here), whose records
    say more."""
    found = segment_records(c)
    return {s.index: [u.label for u in found.get(s.index, [])] for s in c.segments}


def read_description(
    url: str | os.PathLike[str], **storage_options: Any
) -> tuple[Container, list[NamedRow]]:
    """Read the metadata of the file at ``url`` (and the XNNPACK graphs its tensor info
    comes from): the parsed container (a provenance trailer, if any, hidden: it is not
    part of the container) and its ``named_data`` rows with ``size`` and
    ``tensor_info``. Raises as :func:`describe` does."""
    d = read_files(url, **storage_options)
    return d["container"], d["named"]


def read_files(
    url: str | os.PathLike[str],
    ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> dict[str, Any]:
    """Everything :func:`describe` and ``inspect`` show, read once: ``container``,
    ``named`` (its rows), ``size`` (the whole object, trailer included), ``provenance``
    (:func:`~ptestore.provenance.provenance_json`), ``keys`` (for a .pte: every key
    with where its bytes are, see :func:`key_rows`) and, with ``ptd``, the same under
    ``ptd``."""
    from .format.reader import read_container
    from .format.tensors import describe_tensors, named_data_json, tensor_index_of
    from .journal import recover_if_local
    from .provenance import provenance_json
    from .provenance.trailer import without_any_trailer
    from .storage.loaders import open_loader

    recover_if_local(url)  # an interrupted in-place specialization: finish it first
    loaders = [open_loader(url, **storage_options)]
    try:
        if ptd is not None:
            loaders.append(open_loader(ptd, **storage_options))
        parts: list[dict[str, Any]] = []
        for loader in loaders:
            # A damaged trailer: the container all the same, provenance says what is wrong.
            hidden = without_any_trailer(loader)
            try:
                parsed = read_container(hidden)
            except FormatError:
                if hidden is loader or getattr(hidden, "trailer", None) is not None:
                    raise
                # The damaged footer's content_size is no container end (it may be the
                # damage): the container is the whole file's, as without a trailer.
                hidden = loader
                parsed = read_container(hidden)
            parts.append(
                {
                    "loader": hidden,
                    "parsed": parsed,
                    "container": parsed.container,
                    "size": loader.size(),
                    "provenance": provenance_json(loader),
                }
            )
        main = parts[0]
        if ptd is not None:
            from .errors import ConfigurationError

            if main["container"].kind != "pte" or parts[1]["container"].kind != "ptd":
                raise ConfigurationError(
                    f"inspect {url} with --ptd {ptd}: expected a .pte and a .ptd, found a "
                    f".{main['container'].kind} and a .{parts[1]['container'].kind}"
                )
        if main["container"].kind == "pte":
            index = describe_tensors(
                main["parsed"], main["loader"], parts[1]["parsed"] if ptd is not None else None
            )
        else:
            index = tensor_index_of(main["parsed"], main["loader"])
        for part in parts:
            part["named"] = named_data_json(part["parsed"], part["loader"], index)
        if main["container"].kind == "pte":
            main["keys"] = key_rows(
                main["container"], index, parts[1]["container"] if ptd is not None else None
            )
        if ptd is not None:
            main["ptd"] = parts[1]
        return main
    finally:
        for loader in loaders:
            loader.close()


def describe(
    url: str | os.PathLike[str] | Container,
    ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> dict[str, Any]:
    """What ``ptestore inspect --json URL [--ptd PTD]`` prints, as a dict.

    Args:
        url: a local path or fsspec URL (``file://``, ``memory://``, ``s3://``, ...) of
            a ``.pte`` or ``.ptd``; or an already parsed
            :class:`~ptestore.format.model.Container`, described from its metadata
            alone (``tensor_info`` is then None: see :func:`describe_container`).
        ptd: the ``.ptd`` of the ``.pte`` at ``url``: both are described, ``ptd`` holds
            the ``.ptd``'s description and ``keys`` every key of the pair with the file
            its bytes are in.
        **storage_options: as for :func:`~ptestore.open_loader` (for S3,
            ``endpoint_url``, ``key``, ``secret``, ``profile``, ...).

    Returns:
        The fields documented in docs/cli.md (``format``, ``file_size``, ``header``,
        ``methods``, ``segments``, ``named_data`` with ``size`` and ``tensor_info`` per
        key, ``keys`` (a .pte: every key it uses, ``file`` ``"pte"``, ``"ptd"`` or
        ``"external"``), ``delegates``, ``waste``, ``provenance``, ``warnings``, ...).
        Only metadata is read: the header, the FlatBuffer, a provenance trailer and,
        for tensor info, XNNPACK delegate graphs.

    Raises:
        FormatError: the file is malformed, truncated or hostile.
        ObjectNotFound: nothing at ``url``.
        ConfigurationError: an unknown URL scheme or a storage option that does not
            apply (the message lists the accepted ones).
        PermissionDenied: access refused.
        StorageError: other I/O failures, after retries.
    """
    if isinstance(url, Container):
        if storage_options or ptd is not None:
            raise TypeError("describe(container) takes no ptd or storage options")
        return describe_container(url)
    return describe_files(read_files(url, ptd, **storage_options))


def describe_files(d: dict[str, Any]) -> dict[str, Any]:
    """The :func:`describe` object of what :func:`read_files` read."""
    out = describe_container(d["container"], d["named"])
    out["file_size"] = d["size"]
    out["provenance"] = d["provenance"]
    if "keys" in d:
        out["keys"] = d["keys"]
        out["warnings"] += size_warnings(d["keys"])
    if "ptd" in d:
        out["ptd"] = describe_files(d["ptd"])
    return out


def describe_container(c: Container, named: Sequence[NamedRow] | None = None) -> dict[str, Any]:
    """The :func:`describe` object of a parsed container. ``named``: its ``named_data``
    rows from :func:`ptestore.format.tensors.named_data_json` (size and tensor info);
    without them each row has key, segment index and size, and ``tensor_info`` None."""
    rows: list[dict[str, Any]] = []
    for i, e in enumerate(c.named_data):
        item: dict[str, Any] = (
            dict(named[i])
            if named is not None
            else {
                "key": e.key,
                "segment_index": e.segment_index,
                "size": c.segments[e.segment_index].size,
                "tensor_info": None,
            }
        )
        if c.kind == "ptd":
            lt = e.tensor_layout
            item["tensor_layout"] = None if lt is None else lt.to_json()
        rows.append(item)
    return {
        "format": c.kind,
        "source": c.source,
        "file_size": c.file_size,
        "header": header_json(c),
        "metadata_size": c.metadata_size,
        "methods": list(c.methods),
        "segments": [
            {
                "index": s.index,
                "offset": s.offset,
                "size": s.size,
                "absolute_offset": c.segment_base_offset + s.offset,
                "alignment": inferred_alignment(c.segment_base_offset + s.offset),
                "offset_present": s.offset_present,
                "size_present": s.size_present,
            }
            for s in c.segments
        ],
        "named_data": rows,
        "delegates": [
            {
                "method": d.method,
                "id": d.id,
                "location": d.location,
                "index": d.index,
                "compile_specs": [
                    {"key": cs.key, "value": cs.value.hex()} for cs in d.compile_specs
                ],
            }
            for d in c.delegates
        ],
        "constant_segment": None
        if c.constant_segment is None
        else {
            "segment_index": c.constant_segment.segment_index,
            "offsets": list(c.constant_segment.offsets),
        },
        "mutable_data_segments": [
            {"segment_index": m.segment_index, "offsets": list(m.offsets)}
            for m in c.mutable_data_segments
        ],
        "waste": waste(c),
        "warnings": list(c.warnings),
    }


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    # Cells hold keys, method names, backend ids and labels from the file: escaped.
    rows = [[printable(cell) for cell in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if cell.isdigit() else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    lines = [fmt(headers), fmt(["-" * w for w in widths])]
    lines.extend(fmt(r) for r in rows)
    return lines


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _dtype_shape(row: NamedRow | None) -> str:
    info = None if row is None else row.get("tensor_info")
    if not isinstance(info, dict):
        return "-"
    shape = "x".join(str(d) for d in info.get("shape", [])) or "scalar"
    return f"{info.get('dtype')} [{shape}]"


def render_files(d: dict[str, Any]) -> str:
    """The readable report of what :func:`read_files` read: the container, where every
    key of a .pte is (with its .ptd: both files), and the provenance."""
    out = [render_table(d["container"], d["named"])]
    trailer = d["size"] - d["container"].file_size
    if trailer:
        out.append(f"provenance trailer: {trailer} bytes after the container (not waste)")
    out.append(_render_provenance(d["provenance"]))
    keys = d.get("keys")
    if keys is not None and ("ptd" in d or any(r["file"] == "external" for r in keys)):
        out.append("")
        out.append(f"keys of the program ({len(keys)}), as the runtime merges them:")
        rows = [
            [
                _short(r["key"], 66),
                r["file"] if r["file"] != "external" else "external (a .ptd)",
                "-" if r["size"] is None else str(r["size"]),
                _dtype_shape(r),
            ]
            for r in keys
        ]
        out.extend("  " + line for line in _table(["key", "in", "size", "dtype [shape]"], rows))
    for warning in size_warnings(keys or []):
        out.append(f"warning: {printable(warning)}")
    if "ptd" in d:
        out.append("")
        out.append(render_files(d["ptd"]))
    return "\n".join(out)


def _render_provenance(p: dict[str, Any] | None) -> str:
    if p is None:
        return "provenance: none"
    if "error" in p:
        return f"provenance: unreadable: {printable(str(p['error']))}"

    # Every string here is the record's (the file's): cut to a few hundred characters (a
    # 1 MB device name made a 1 MB line; --json keeps them whole), one printable line each.
    def f(value: object) -> str:
        return clipped(str(value))

    made = f"{f(p.get('ptestore_version'))} at {f(p.get('created'))}"
    lines = [f"provenance: made by ptestore {made}"]
    src = p.get("source") or {}
    lines.append(f"  source: {f(src.get('url'))} ({f(src.get('sha256'))})")
    for b in p.get("backends") or []:
        c = b.get("compatibility")
        compat = f", compatibility {shown(c, REPORT_CHARS)}" if c else ""
        spec = f"{f(b.get('spec'))} {f(b.get('version'))}"
        lines.append(f"  backend {f(b.get('id'))}: {spec}{compat}")
    dev = p.get("device")
    lines.append(
        "  device: none" if dev is None else f"  device: {f(dev['name'])} ({f(dev['digest'])})"
    )
    return "\n".join(printable(line) for line in lines)


def render_table(c: Container, named: Sequence[NamedRow] | None = None) -> str:
    """A readable multi-section report of a container; ``named`` as for
    :func:`describe_container` adds a dtype/shape column to the named data."""
    out: list[str] = []
    kind = ".pte (ExecuTorch Program)" if c.kind == "pte" else ".ptd (FlatTensor data)"
    out.append(f"{printable(c.source)}: {kind}, {c.file_size} bytes")
    h = header_json(c)
    if h is None:
        out.append("header: none (no segment data)")
    else:
        out.append("header: " + ", ".join(f"{k}={v}" for k, v in h.items()))
    out.append(f"metadata: {c.metadata_size} bytes")
    if c.kind == "pte":
        out.append("")
        names = (printable(clipped(m)) for m in c.methods)
        out.append(f"methods ({len(c.methods)}): " + ", ".join(names))
        out.append("")
        out.append(f"delegates ({len(c.delegates)}):")
        if c.delegates:
            rows = []
            for d in c.delegates:
                specs = "; ".join(
                    f"{_short(cs.key, 40)}={_short(cs.value.hex(), 24)}" for cs in d.compile_specs
                )
                method, backend = _short(d.method, 66), _short(d.id, 66)
                rows.append(
                    [method, str(d.position), backend, d.location, str(d.index), specs or "-"]
                )
            out.extend(
                "  " + line
                for line in _table(
                    ["method", "#", "backend", "location", "index", "compile specs"], rows
                )
            )
    out.append("")
    users = segment_records(c)
    out.append(f"segments ({len(c.segments)}), base {c.segment_base_offset}:")
    if c.segments:
        rows = []
        for s in c.segments:
            absolute = c.segment_base_offset + s.offset
            used = [u.label for u in users.get(s.index, [])] or ["(unreferenced)"]
            label = used[0] if len(used) == 1 else f"{used[0]} (+{len(used) - 1} more)"
            rows.append(
                [
                    str(s.index),
                    str(s.offset),
                    str(absolute),
                    str(s.size),
                    str(inferred_alignment(absolute)),
                    _short(label, 60),
                ]
            )
        out.extend(
            "  " + line
            for line in _table(["#", "offset", "absolute", "size", "align", "used by"], rows)
        )
    out.append("")
    out.append(f"named data ({len(c.named_data)}):")
    if c.named_data:
        rows = []
        for i, e in enumerate(c.named_data):
            size = c.segments[e.segment_index].size
            row = [_short(e.key, 66), str(e.segment_index), str(size)]
            row.append(_dtype_shape(None if named is None else named[i]))
            if c.kind == "ptd":
                lt = e.tensor_layout
                row.append("-" if lt is None else f"type {lt.scalar_type} sizes {list(lt.sizes)}")
            rows.append(row)
        heads = ["key", "segment", "size", "dtype [shape]"]
        heads += ["layout"] if c.kind == "ptd" else []
        out.extend("  " + line for line in _table(heads, rows))
    w = waste(c)
    out.append("")
    out.append(
        "waste: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w.items() if k != "total")
        + f"; total {w['total']} bytes ({100.0 * w['total'] / max(1, c.file_size):.1f}%)"
    )
    for warning in c.warnings:
        out.append(f"warning: {printable(warning)}")
    return "\n".join(out)
