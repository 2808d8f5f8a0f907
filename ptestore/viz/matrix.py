"""The fleet matrix: models x devices, one cell per pair, in one self-contained HTML page
(``ptestore fleet run|plan JOB --report FILE.html``), or its data as JSON (``--report
FILE.json``).

:func:`matrix_data` gathers, from a plan and (after a run) its result, each pair's status
(``done``, ``skipped``, ``failed``, ``would run``), why, the error of a failed pair,
seconds, bytes through the client and, from the artifact at its destination (its size
and its provenance trailer), the artifact's size and the compatibility its backends
recorded. :func:`matrix_html` draws that data; :func:`write_report` writes either form.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
from typing import TYPE_CHECKING, Any

from .html import esc, human, page, write_text
from .resources import asset

if TYPE_CHECKING:
    from ..fleet.plan import Plan, PlannedPair
    from ..fleet.runner import FleetResult

__all__ = ["STATUSES", "matrix_data", "matrix_html", "write_report"]

#: Every status a cell can have, and its colour.
STATUSES = {
    "done": "#2e9d5b",
    "skipped": "#9fc5e8",
    "failed": "#d9534f",
    "would run": "#f2b134",
}
#: Destinations looked at at once (a size and a trailer each).
_THREADS = 16


def _artifact(
    urls: list[str], options: dict[str, Any], shared_root: str | None = None
) -> dict[str, Any]:
    """Size and recorded compatibility of the artifact at ``urls`` (.pte, then .ptd;
    with ``shared_root`` the .ptd is the one stored there by the content address the
    .pte's record names, and ``ptd_destination`` says where); ``{}`` when there is
    none or it cannot be read."""
    from ..errors import PteStoreError
    from ..fleet.shared import shared_url
    from ..provenance import read_provenance
    from ..storage.loaders import open_loader

    sizes: list[int] = []
    compat: list[str] = []
    found: dict[str, Any] = {}
    urls = list(urls)
    for url in urls:
        try:
            loader = open_loader(url, **options)
        except PteStoreError:
            return {}
        try:
            sizes.append(loader.size())
            prov = read_provenance(loader)
        except PteStoreError:
            prov = None
        finally:
            loader.close()
        if prov is not None and url == urls[0]:
            compat = [f"{b.id}: {b.compatibility}" for b in prov.backends]
            if shared_root is not None and prov.ptd_output is not None and len(urls) > 1:
                try:
                    urls[1] = found["ptd_destination"] = shared_url(
                        shared_root, prov.ptd_output.sha256
                    )
                except PteStoreError:
                    return {}
    return {
        "size": sum(sizes),
        "pte_size": sizes[0],
        "ptd_size": sizes[1] if len(sizes) > 1 else None,
        "compatibility": compat,
        **found,
    }


def matrix_data(
    plan: Plan, result: FleetResult | None = None, *, artifacts: bool = True
) -> dict[str, Any]:
    """The matrix of ``plan`` (before a run: ``would run``/``skipped``/``failed``) or of
    its ``result`` (``done``/``skipped``/``failed``), as JSON-ready data.

    ``artifacts``: also look at every destination for the artifact's size and recorded
    compatibility (a size and a small ranged read of the trailer per pair)."""
    from ..fleet.shared import shared_root

    job = plan.job
    rows: list[dict[str, Any]] = []
    for i, p in enumerate(plan.pairs):
        cell: dict[str, Any] = {
            "model": p.pair.model.name,
            "device": p.pair.device.name,
            "destination": p.pair.destination,
            "ptd_destination": p.pair.ptd_destination,
        }
        if result is None:
            cell.update(_planned(p))
        else:
            r = result.pairs[i]
            cell.update(
                status=r.status,
                reason=r.reason or p.reason,
                error=r.error,
                seconds=round(r.seconds, 6),
                bytes=r.bytes,
                planner_bytes=p.bytes,
            )
        cell.setdefault("size", None)
        cell.setdefault("pte_size", None)
        cell.setdefault("ptd_size", None)
        cell.setdefault("compatibility", [])
        cell["not_indexed"] = None
        rows.append(cell)
    if result is not None and result.index_shards:
        from ..fleet.index_pins import superseded_line

        where = {(c["model"], c["device"]): c for c in rows}
        for left in result.index_shards.get("superseded", ()):
            found = where.get((left["model"], left["device"]))
            if found is not None:
                found["not_indexed"] = superseded_line(left)
    if artifacts:

        def look(cell: dict[str, Any]) -> dict[str, Any]:
            urls = [cell["destination"]] + (
                [cell["ptd_destination"]] if cell["ptd_destination"] else []
            )
            root = shared_root(job.destination) if cell["ptd_destination"] else None
            return _artifact(urls, dict(job.storage_options), root)

        with cf.ThreadPoolExecutor(max_workers=_THREADS) as pool:
            for cell, found in zip(rows, pool.map(look, rows), strict=True):
                cell.update(found)
    totals: dict[str, Any] = {
        s.replace(" ", "_"): sum(1 for c in rows if c["status"] == s) for s in STATUSES
    }
    # A .ptd stored once by its content address (fleet/shared.py) is one object however
    # many pairs use it: count it once.
    ptds = {c["ptd_destination"]: c["ptd_size"] for c in rows if c["ptd_size"] is not None}
    totals.update(
        pairs=len(rows),
        bytes=sum(c["bytes"] for c in rows),
        planner_bytes=sum(c["planner_bytes"] for c in rows),
        artifact_bytes=sum(c["pte_size"] or 0 for c in rows) + sum(ptds.values()),
        ptd_objects=len(ptds),
        pair_seconds=round(sum(c["seconds"] for c in rows), 6),
    )
    if result is None:
        totals["estimated_client_bytes"] = plan.estimate.client_bytes
    return {
        "job": job.path,
        "kind": "plan" if result is None else "run",
        "engine": None if result is None else result.engine,
        "seconds": None if result is None else round(result.seconds, 6),
        "index": None if result is None else result.index,
        "index_error": None if result is None else result.index_error,
        "index_errors": None if result is None else [dict(e) for e in result.index_errors],
        "index_shards": None if result is None else result.index_shards,
        "backends": list(job.backends),
        "models": [m.name for m in job.models],
        "devices": [d.name for d in job.devices],
        "totals": totals,
        "pairs": rows,
    }


def _planned(p: PlannedPair) -> dict[str, Any]:
    status = {"run": "would run", "skip": "skipped", "fail": "failed"}[p.action]
    return {
        "status": status,
        "reason": p.reason,
        "error": p.reason if p.action == "fail" else None,
        "seconds": 0.0,
        "bytes": p.bytes,
        "planner_bytes": p.bytes,
        "estimated_client_bytes": p.estimate.client_bytes,
    }


def write_report(
    path: str | os.PathLike[str], plan: Plan, result: FleetResult | None = None
) -> dict[str, Any]:
    """Write the matrix to the local file ``path``: JSON when it ends with ``.json``,
    else the HTML page. Returns the data."""
    data = matrix_data(plan, result)
    if os.fspath(path).endswith(".json"):
        write_text(path, json.dumps(data, indent=2) + "\n")
    else:
        write_text(path, matrix_html(data))
    return data


# ---------------------------------------------------------------------------- drawing


def _cell_title(c: dict[str, Any]) -> str:
    parts = [f"{c['model']} on {c['device']}: {c['status']}"]
    if c.get("error"):
        parts.append(f"error: {c['error']}")
    elif c.get("reason"):
        parts.append(c["reason"])
    if c.get("not_indexed"):
        parts.append(c["not_indexed"])
    if c.get("size") is not None:
        parts.append(f"artifact {human(c['size'])}")
    if c.get("estimated_client_bytes") is not None:
        parts.append(f"estimated through the client {human(c['estimated_client_bytes'])}")
    if c.get("seconds"):
        parts.append(f"{c['seconds']:.3f} s")
    return "\n".join(parts)


def _index_rows(data: dict[str, Any]) -> str:
    """The failures table's rows of what was left out of the index: one per reason
    (``index_errors``; a report without them, its ``index_error``)."""
    errors = data.get("index_errors") or (
        [{"model": None, "device": None, "error": data["index_error"]}]
        if data.get("index_error")
        else []
    )
    rows = []
    for e in errors:
        if e["model"] is None:
            who = "<td colspan=2>the job (index)</td>"
        else:
            who = f"<td>{esc(e['model'])}</td><td>{esc(e['device'] or 'its index')}</td>"
        rows.append(f'<tr class="job">{who}<td class=mono>{esc(e["error"])}</td></tr>')
    return "".join(rows)


def _failure_rows(pairs: list[dict[str, Any]], failed: list[dict[str, Any]]) -> tuple[str, str]:
    """The failures table's rows: one per distinct error (a job-wide error, or a
    model's unreadable source, is listed once with every pair it failed), and the note
    for the rows beyond 500."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in failed:
        groups.setdefault(c["error"] or "", []).append(c)
    index = {id(c): i for i, c in enumerate(pairs)}
    rows = []
    for error, cells in list(groups.items())[:500]:
        models = sorted({c["model"] for c in cells})
        devices = sorted({c["device"] for c in cells})
        if len(cells) == 1:
            who = f"<td>{esc(models[0])}</td><td>{esc(devices[0])}</td>"
        elif len(cells) == len(pairs):
            who = f"<td colspan=2>every pair ({len(cells)})</td>"
        else:
            who = (
                f"<td>{esc(', '.join(models))}</td>"
                f"<td>{esc(', '.join(devices))} ({len(cells)} pairs)</td>"
            )
        rows.append(
            f'<tr data-i="{index[id(cells[0])]}" data-pairs="{len(cells)}">{who}'
            f"<td class=mono>{esc(error)}</td></tr>"
        )
    extra = len(groups) - 500
    more = f"<p class=muted>and {extra} more errors</p>" if extra > 0 else ""
    return "".join(rows), more


def matrix_html(data: dict[str, Any]) -> str:
    """The page of :func:`matrix_data`'s ``data``."""
    models, devices = data["models"], data["devices"]
    cells = {(c["model"], c["device"]): (i, c) for i, c in enumerate(data["pairs"])}
    t = data["totals"]
    head = "".join(
        f'<th class="dev" data-device="{esc(d)}" title="{esc(d)}"><span>{esc(d)}</span></th>'
        for d in devices
    )
    body = []
    for m in models:
        tds = []
        for d in devices:
            found = cells.get((m, d))
            if found is None:
                tds.append(f'<td class="cell none" data-device="{esc(d)}"></td>')
                continue
            i, c = found
            tds.append(
                f'<td class="cell" data-i="{i}" data-model="{esc(m)}" data-device="{esc(d)}" '
                f'data-status="{esc(c["status"])}" title="{esc(_cell_title(c))}"></td>'
            )
        body.append(
            f'<tr data-model="{esc(m)}"><th class="model" title="{esc(m)}">{esc(m)}</th>'
            f"{''.join(tds)}</tr>"
        )
    legend = "".join(
        f'<label class="item"><input type="checkbox" name="status" value="{esc(s)}" checked>'
        f'<span class="swatch" style="background:{col}"></span>{esc(s)} '
        f'<span class="count">{t.get(s.replace(" ", "_"), 0)}</span></label>'
        for s, col in STATUSES.items()
    )
    what = "plan" if data["kind"] == "plan" else "run"
    summary = [f"{t['pairs']} pairs ({len(models)} models x {len(devices)} devices)"]
    planner = t.get("planner_bytes", 0)
    if data["kind"] == "run":
        summary.append(
            f"bytes through the client {human(t['bytes'])} (the pairs "
            f"{human(t['bytes'] - planner)}, the planner {human(planner)})"
        )
    else:
        summary.append(
            f"estimated through the client by a run's pairs "
            f"{human(t.get('estimated_client_bytes', 0))} (the planner read {human(planner)})"
        )
    ptd = t.get("ptd_objects", 0)
    summary.append(
        f"artifacts {human(t['artifact_bytes'])}"
        + (f" (each shared .ptd counted once: {ptd})" if ptd else "")
    )
    if data["kind"] == "run":
        summary.append(f"wall time {data['seconds']:.2f} s ({data['engine']})")
        summary.append(f"the pairs' own times summed {t['pair_seconds']:.2f} s")
    if data.get("index_shards"):
        from ..fleet.index_store import shards_line

        summary.append(f"index {shards_line(data['index_shards'])}")
    failed = [c for c in data["pairs"] if c["status"] == "failed"]
    failures, more = _failure_rows(data["pairs"], failed)
    failures = _index_rows(data) + failures
    left = [c for c in data["pairs"] if c.get("not_indexed")]
    not_indexed = (
        f'<h2>Done, not indexed ({len(left)})</h2><table id="not-indexed">'
        "<tr><th>model</th><th>device</th><th>why</th></tr>"
        + "".join(
            f"<tr><td>{esc(c['model'])}</td><td>{esc(c['device'])}</td>"
            f"<td class=mono>{esc(c['not_indexed'])}</td></tr>"
            for c in left
        )
        + "</table>"
        if left
        else ""
    )
    html = (
        f"<h1>ptestore fleet {what}: {esc(os.path.basename(data['job']))}</h1>"
        f'<div class="muted"><span class="mono">{esc(data["job"])}</span> · '
        f"backends {esc(', '.join(data['backends']))}</div>"
        f'<div class="totals panel" id="totals">{" · ".join(esc(s) for s in summary)}</div>'
        '<div class="controls legend">' + legend + "</div>"
        '<div class="controls">'
        '<label>models <input type="search" id="filter-model" placeholder="filter (text or '
        '/regex/)"></label>'
        '<label>devices <input type="search" id="filter-device" placeholder="filter"></label>'
        '<label>sort models by <select id="sort-model"><option value="name">name</option>'
        '<option value="failed">failed first</option><option value="seconds">time</option>'
        '<option value="size">artifact size</option><option value="bytes">bytes moved</option>'
        "</select></label>"
        '<label>devices by <select id="sort-device"><option value="name">name</option>'
        '<option value="failed">failed first</option><option value="seconds">time</option>'
        '<option value="size">artifact size</option><option value="bytes">bytes moved</option>'
        "</select></label>"
        '<label>cells show <select id="cell-text"><option value="">colour only</option>'
        '<option value="size">size</option><option value="seconds">time</option></select>'
        "</label>"
        '<span id="shown" class="muted"></span></div>'
        f'<div class="scroll"><table id="matrix"><thead><tr><th class="corner">model \\ device'
        f"</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        '<div id="details" class="panel"><span class="muted">Hover or click a cell.</span></div>'
        f"<h2>Failed pairs ({len(failed)})</h2>"
        + (
            f'<table id="failures"><tr><th>model</th><th>device</th><th>error</th></tr>'
            f"{failures}</table>{more}"
            if failures
            else "<p class=muted>none</p>"
        )
        + not_indexed
    )
    return page(
        f"ptestore fleet {what}: {os.path.basename(data['job'])}",
        html,
        css=asset("matrix.css")
        + "".join(
            f'td.cell[data-status="{s}"] {{ background: {c}; }}' for s, c in STATUSES.items()
        ),
        script=asset("matrix.js"),
        data=data,
    )
