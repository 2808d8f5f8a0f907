"""The layout map: one self-contained HTML page that draws where every byte of a .pte or
.ptd (or a pair) lies, to scale or in a readable mode, and what a specialization changed.

:func:`layout_html` reads the files (metadata only, plus the provenance trailer; with
``compare`` also the segment bytes of both sides, to tell replaced from unchanged) and
returns the page; :func:`write_layout_html` writes it. :func:`layout_regions` turns a
:func:`ptestore.describe` object into the regions the page draws, and
:func:`render_layout` draws regions; both work on synthesized descriptions too. They
live in :mod:`.regions`, :mod:`.compare` and :mod:`.draw` and are re-exported here.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigurationError
from ..storage.types import local_path, redacted_url
from .compare import compare_regions, segment_hashes, shared_ranges
from .draw import render_layout
from .html import write_text
from .regions import FileMap, layout_regions

__all__ = [
    "FileMap",
    "compare_files",
    "compare_regions",
    "layout_html",
    "layout_regions",
    "render_layout",
    "shared_ranges",
    "write_layout_html",
]


def _read(
    url: str, storage_options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from ..inspection import describe_container, read_description
    from ..provenance import provenance_json
    from ..storage.loaders import open_loader

    container, rows = read_description(url, **storage_options)
    desc = describe_container(container, rows)
    loader = open_loader(url, **storage_options)
    try:
        prov = provenance_json(loader)
        # The container's size ends where its content does; the file's, after the
        # provenance trailer: the bar and its label are the file's.
        desc["file_size"] = max(int(desc["file_size"]), loader.size())
    finally:
        loader.close()
    return desc, prov


def _file_map(
    url: str, desc: dict[str, Any], prov: dict[str, Any] | None, role: str = ""
) -> FileMap:
    notes = list(desc.get("warnings", []))
    if isinstance(prov, dict) and "error" in prov:
        notes.append(f"provenance trailer: {prov['error']}")
        prov = None
    kind = ".pte" if desc.get("format") == "pte" else ".ptd"
    url = redacted_url(url)  # what the page and the comparison show: no credential
    title = f"{role + ': ' if role else ''}{kind} {os.path.basename(url.rstrip('/')) or url}"
    return FileMap(title, url, int(desc["file_size"]), layout_regions(desc, prov), role, notes)


def _local_path(url: str) -> str | None:
    return local_path(url)


def _maps(
    url: str,
    ptd: str | os.PathLike[str] | None,
    compare: str | os.PathLike[str] | None,
    compare_ptd: str | os.PathLike[str] | None,
    storage_options: dict[str, Any],
) -> list[FileMap]:
    """The files to draw (a compared file after its source), regions marked."""
    maps: list[FileMap] = []
    pairs = [(url, None if compare is None else os.fspath(compare))]
    if ptd is not None:
        pairs.append((os.fspath(ptd), None if compare_ptd is None else os.fspath(compare_ptd)))
    if compare_ptd is not None and ptd is None:
        raise ConfigurationError("compare_ptd (--compare-ptd) needs ptd (--ptd PTD)")
    for i, (target, source) in enumerate(pairs):
        desc, prov = _read(target, storage_options)
        want = "ptd" if i else "pte"
        if ptd is not None and desc["format"] != want:  # as inspect --ptd refuses it
            raise ConfigurationError(
                f"inspect {redacted_url(url)} with --ptd {redacted_url(os.fspath(ptd))}: "
                "expected a .pte and a .ptd, "
                f"found a .{desc['format']} as the {'.ptd' if i else '.pte'}"
            )
        if source is None:
            maps.append(_file_map(target, desc, prov))
            continue
        sdesc, sprov = _read(source, storage_options)
        smap = _file_map(source, sdesc, sprov, "source")
        amap = _file_map(target, desc, prov, "specialized")
        local = _local_path(target)
        shared = shared_ranges(local) if local is not None else None
        compare_regions(
            smap.regions,
            amap.regions,
            segment_hashes(source, sdesc, storage_options),
            segment_hashes(target, desc, storage_options),
            shared,
        )
        maps.extend([smap, amap])
    return maps


def compare_files(
    url: str | os.PathLike[str],
    compare: str | os.PathLike[str],
    *,
    ptd: str | os.PathLike[str] | None = None,
    compare_ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> dict[str, Any]:
    """What the layout map's comparison shows, as data (``inspect URL --compare SRC
    --json``): :func:`ptestore.format.layoutdiff.layout_changes` of ``url`` against its
    source ``compare``, with ``file`` and ``source`` URLs; with ``ptd`` and
    ``compare_ptd``, the same for the .ptd under ``"ptd"``. Reads the segment bytes of
    every file."""
    from ..format.layoutdiff import layout_changes

    maps = _maps(os.fspath(url), ptd, compare, compare_ptd, storage_options)
    out: list[dict[str, Any]] = []
    for i in range(0, len(maps) - 1, 2):
        src, art = maps[i], maps[i + 1]
        out.append(
            {"file": art.url, "source": src.url}
            | layout_changes(
                src.regions,
                art.regions,
                source_size=src.file_size,
                artifact_size=art.file_size,
            )
        )
    result = out[0]
    if len(out) > 1:
        result["ptd"] = out[1]
    return result


def layout_html(
    url: str | os.PathLike[str],
    *,
    ptd: str | os.PathLike[str] | None = None,
    compare: str | os.PathLike[str] | None = None,
    compare_ptd: str | os.PathLike[str] | None = None,
    **storage_options: Any,
) -> str:
    """The layout map of ``url`` (a .pte or .ptd, local path or fsspec URL) as one
    self-contained HTML page.

    Args:
        url: the file to draw.
        ptd: its .ptd, drawn below it (a pair).
        compare: the source ``url`` was specialized from: the page then draws both,
            coloured by change, and marks each segment replaced, grown, shrunk, moved,
            cloned, unchanged or new. This reads the segment bytes of both files.
        compare_ptd: the source of ``ptd``, compared the same way.
        **storage_options: as for :func:`ptestore.open_loader`, for every URL.

    Raises the errors of :func:`ptestore.describe`."""
    url = os.fspath(url)
    maps = _maps(url, ptd, compare, compare_ptd, storage_options)
    shown = redacted_url(url)
    title = f"ptestore layout map: {os.path.basename(shown.rstrip('/')) or shown}"
    return render_layout(maps, title=title)


def write_layout_html(
    path: str | os.PathLike[str], url: str | os.PathLike[str], **kwargs: Any
) -> None:
    """Write :func:`layout_html` of ``url`` to the local file ``path``."""
    write_text(path, layout_html(url, **kwargs))
