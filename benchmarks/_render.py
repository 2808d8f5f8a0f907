"""Markdown tables of a ``benchmarks/run.py`` result (``run.py --render FILE``)."""

from __future__ import annotations

from typing import Any

LABELS = {
    "cp_sync": "`cp --reflink=never` + `sync FILE`",
    "cp_reflink": "`cp --reflink=always` + `sync FILE`",
    "passthrough": "ptestore passthrough",
    "bare": "`python -c pass` (a bare interpreter)",
    "cli": "`python -m ptestore specialize --backend passthrough --no-provenance`",
    "cli_provenance": "`python -m ptestore specialize --backend passthrough` (SHA-256 trailer)",
    "one": "ptestore, one 16 MiB weight doubled",
    "tenpct": "ptestore, >= 10% of bytes replaced",
    "et": "ExecuTorch round trip (deserialize + serialize)",
}


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(result: dict[str, Any]) -> str:
    idle = result["idle_maxrss_mib"]
    lines: list[str] = []
    for name, series in result["series"].items():
        lines += [
            f"**{name}** (medians of {next(iter(series['summary'].values()))['runs']} runs)",
            "",
            "| case | wall s | x cp+sync | inner s | inner x cp+sync | peak RSS MiB "
            "| over idle MiB | read MiB | written MiB | new space MiB | cloned MiB "
            "| over bare s | over bare x cp+sync |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for case, s in series["summary"].items():
            rep = s.get("report") or {}
            cloned = rep.get("bytes_cloned")
            lines.append(
                f"| {LABELS.get(case, case)} | {_f(s.get('wall_s'))} "
                f"| {_f(s.get('wall_vs_cp_sync'))} | {_f(s.get('inner_s'))} "
                f"| {_f(s.get('inner_vs_cp_sync'), 3)} | {_f(s.get('maxrss_mib'), 0)} "
                f"| {_f(s['maxrss_mib'] - idle, 0)} | {_f(s.get('read_mib'), 0)} "
                f"| {_f(s.get('written_mib'), 0)} | {_f(s.get('new_space_mib'), 1)} "
                f"| {_f(None if cloned is None else cloned / (1 << 20), 0)} "
                f"| {_f(s.get('over_bare_s'), 3)} | {_f(s.get('over_bare_vs_cp_sync'), 3)} |"
            )
        lines.append("")
    return "\n".join(lines)
