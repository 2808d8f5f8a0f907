"""SVG figures of a ``benchmarks/run.py`` result, in plain Python (no plotting library).

    python benchmarks/plots.py docs/benchmarks-data.json --out docs/img

writes, into ``--out``:

- ``bench-time.svg``: wall time against model size, one panel per file system, one line
  per case (medians; every run as a dot), log-log;
- ``bench-space.svg``: new disk space against model size, the same way (linear space);
- ``bench-s3.svg``: bytes through the client of an S3 to S3 specialization, server-side
  copies against streaming (the ``s3_copy`` entry, from ``bench_s3_copy.py --into``).

The figures are small, self-contained SVG (system fonts, no scripts) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Case -> (label, colour, dash), in legend order.
CASES = {
    "cp_sync": ("cp + sync", "#6b7785", ""),
    "cp_reflink": ("cp --reflink + sync", "#9aa5b1", "4 3"),
    "passthrough": ("ptestore passthrough", "#2f7ed8", ""),
    "one": ("ptestore, one 16 MiB weight", "#2e9d5b", ""),
    "tenpct": ("ptestore, >= 10% replaced", "#e8684a", ""),
    "et": ("ExecuTorch round trip", "#8e6cc0", "2 3"),
}
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


class Panel:
    """One set of axes: maps data to pixels inside ``(x, y, w, h)``."""

    def __init__(
        self,
        box: tuple[float, float, float, float],
        xr: tuple[float, float],
        yr: tuple[float, float],
        *,
        xlog: bool = False,
        ylog: bool = False,
    ) -> None:
        self.x, self.y, self.w, self.h = box
        self.xr, self.yr, self.xlog, self.ylog = xr, yr, xlog, ylog

    def _t(self, v: float, r: tuple[float, float], log: bool) -> float:
        if log:
            return (math.log10(v) - math.log10(r[0])) / (math.log10(r[1]) - math.log10(r[0]))
        return (v - r[0]) / (r[1] - r[0])

    def px(self, v: float) -> float:
        return self.x + self.w * self._t(v, self.xr, self.xlog)

    def py(self, v: float) -> float:
        return self.y + self.h * (1 - self._t(v, self.yr, self.ylog))


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        out, p = [], math.floor(math.log10(lo))
        while 10**p <= hi * 1.0001:
            if 10**p >= lo * 0.9999:
                out.append(10.0**p)
            p += 1
        return out
    step = 10 ** math.floor(math.log10((hi - lo) / 4 or 1))
    for m in (1, 2, 2.5, 5, 10):
        if (hi - lo) / (step * m) <= 6:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v >= 1 and v == int(v):
        return f"{int(v):,}"
    return f"{v:g}"


def axes(p: Panel, xticks: Sequence[tuple[float, str]], ylabel: str, title: str) -> list[str]:
    out = [
        f'<rect x="{p.x}" y="{p.y}" width="{p.w}" height="{p.h}" fill="#fbfcfd" stroke="#c9d1d9"/>',
        f'<text x="{p.x + p.w / 2}" y="{p.y - 10}" text-anchor="middle" font-weight="600">'
        f"{esc(title)}</text>",
    ]
    for v in _ticks(p.yr[0], p.yr[1], p.ylog):
        y = p.py(v)
        out.append(
            f'<line x1="{p.x}" x2="{p.x + p.w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6eaee"/>'
        )
        out.append(
            f'<text x="{p.x - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#5b6670">{_fmt(v)}</text>'
        )
    for v, label in xticks:
        x = p.px(v)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{p.y}" y2="{p.y + p.h}" stroke="#e6eaee"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{p.y + p.h + 16}" text-anchor="middle" fill="#5b6670">'
            f"{esc(label)}</text>"
        )
    out.append(
        f'<text transform="translate({p.x - 44},{p.y + p.h / 2}) rotate(-90)" '
        f'text-anchor="middle" fill="#1d232a">{esc(ylabel)}</text>'
    )
    return out


def svg(width: int, height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT}" font-size="12">'
        f"<title>{esc(title)}</title>"
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>' + "".join(body) + "</svg>\n"
    )


def _sizes(data: dict[str, Any]) -> dict[str, float]:
    """Program size label -> MiB."""
    return {k: v["bytes"] / 2**20 for k, v in data["programs"].items()}


def series_figure(data: dict[str, Any], metric: str, ylabel: str, title: str, *, ylog: bool) -> str:
    sizes = _sizes(data)
    storages = sorted({name.split("/")[0] for name in data["series"]})
    points: dict[str, dict[str, list[tuple[float, float, list[float]]]]] = {}
    values: list[float] = []
    for name, s in data["series"].items():
        storage, size = name.split("/")
        for case, summary in s["summary"].items():
            v = summary.get(metric)
            if v is None:
                continue
            runs = [r[metric] for r in s["cases"].get(case, []) if r.get(metric) is not None]
            points.setdefault(storage, {}).setdefault(case, []).append((sizes[size], v, runs))
            values += [v, *runs]
    floor = 0.005 if ylog else 0.0
    if ylog:
        lo = 10 ** math.floor(math.log10(max(floor, min(x for x in values if x > 0))))
        hi = 10 ** math.ceil(math.log10(max(values)))
    else:
        lo, hi = 0.0, max(values) * 1.08
    xs = sorted(set(sizes.values()))
    xr = (xs[0] / 1.5, xs[-1] * 1.5)
    pw, ph, left, top = 330, 230, 70, 46
    body: list[str] = []
    for i, storage in enumerate(storages):
        p = Panel((left + i * (pw + 70), top, pw, ph), xr, (lo, hi), xlog=True, ylog=ylog)
        ticks = [(sizes[k], k.replace("M", " MiB").replace("G", " GiB")) for k in sizes]
        body += axes(p, ticks, ylabel if i == 0 else "", f"{storage}")
        for case, (_label, colour, dash) in CASES.items():
            pts = sorted(points.get(storage, {}).get(case, []))
            if not pts:
                continue
            for x, _v, runs in pts:
                for r in runs:
                    ry = p.py(max(r, lo) if ylog else r)
                    body.append(
                        f'<circle cx="{p.px(x):.1f}" cy="{ry:.1f}" r="1.8" fill="{colour}" '
                        'fill-opacity="0.45"/>'
                    )
            path = " ".join(
                f"{'M' if j == 0 else 'L'}{p.px(x):.1f},{p.py(max(v, lo) if ylog else v):.1f}"
                for j, (x, v, _r) in enumerate(pts)
            )
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            body.append(
                f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>'
            )
            for x, v, _r in pts:
                body.append(
                    f'<circle cx="{p.px(x):.1f}" cy="{p.py(max(v, lo) if ylog else v):.1f}" '
                    f'r="3.2" fill="{colour}"><title>{esc(CASES[case][0])}, {storage}, '
                    f"{x:.0f} MiB: {v:.3g}</title></circle>"
                )
        body.append(
            f'<text x="{p.x + pw / 2}" y="{top + ph + 34}" text-anchor="middle">model size</text>'
        )
    width = left + len(storages) * (pw + 70)
    legend_y = top + ph + 56
    x = left
    for case, (label, colour, dash) in CASES.items():
        if not any(case in points.get(s, {}) for s in storages):
            continue
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        step = 40 + 6.8 * len(label)
        if x + step > width and x > left:
            x, legend_y = left, legend_y + 18
        body.append(
            f'<line x1="{x}" x2="{x + 22}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" '
            f'stroke-width="2.5"{dash_attr}/>'
        )
        body.append(f'<text x="{x + 27}" y="{legend_y + 4}">{esc(label)}</text>')
        x += step
    body.insert(
        0,
        f'<text x="{left - 56}" y="18" font-size="14" font-weight="600">{esc(title)}</text>',
    )
    return svg(int(width), int(legend_y + 16), body, title)


def s3_figure(data: dict[str, Any]) -> str:
    s3 = data["s3_copy"]
    modes = [("server-side", "#2e9d5b"), ("streaming", "#d9534f")]
    metrics = [("bytes_sent", "sent"), ("bytes_received", "received")]
    mib = 2**20
    top_v = max(s3[m][k] for m, _c in modes for k, _l in metrics) / mib
    hi = _ticks(0, top_v * 1.05, False)[-1]
    hi = hi if hi >= top_v else hi + (_ticks(0, top_v, False)[1] or hi)
    left, top, pw, ph = 80, 60, 420, 220
    p = Panel((left, top, pw, ph), (0, 1), (0, hi))
    title = "S3 to S3: bytes through the client"
    subtitle = (
        f"{s3['file_size'] / 2**30:.1f} GiB model, {s3['segments']} segments, one "
        f"{s3['replaced_bytes'] // mib} MiB weight replaced, {s3['part_size'] // mib} MiB parts"
    )
    body = [
        f'<text x="12" y="20" font-size="14" font-weight="600">{esc(title)}</text>',
        f'<text x="12" y="37" fill="#5b6670">{esc(subtitle)}</text>',
    ]
    body += axes(p, [], "MiB (request + answer bodies)", "")
    group_w = pw / len(metrics)
    bar = group_w / (len(modes) + 1.2)
    for gi, (key, label) in enumerate(metrics):
        gx = left + gi * group_w + bar * 0.6
        for mi, (mode, colour) in enumerate(modes):
            v = s3[mode][key] / mib
            x, y = gx + mi * bar, p.py(v)
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar - 6:.1f}" '
                f'height="{p.y + ph - y:.1f}" fill="{colour}"><title>{mode}, {label}: '
                f"{s3[mode][key]:,} bytes</title></rect>"
            )
            body.append(
                f'<text x="{x + (bar - 6) / 2:.1f}" y="{y - 5:.1f}" text-anchor="middle">'
                f"{v:,.1f}</text>"
            )
        body.append(
            f'<text x="{gx + bar - 3:.1f}" y="{p.y + ph + 18}" text-anchor="middle">'
            f"{esc(label)}</text>"
        )
    target = s3["target_bytes_each_way"] / mib
    ty = p.py(target)
    body.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#1d232a" '
        'stroke-dasharray="5 4"/>'
    )
    ly = top + ph + 42
    lx = left
    for mode, colour in modes:
        calls = s3[mode].get("calls")
        extra = ""
        if isinstance(calls, dict) and calls:
            extra = " (" + ", ".join(f"{v} {k}" for k, v in calls.items()) + ")"
        body.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{colour}"/>')
        body.append(f'<text x="{lx + 17}" y="{ly}">{esc(mode + extra)}</text>')
        ly += 18
    body.append(
        f'<line x1="{lx}" x2="{lx + 12}" y1="{ly - 4}" y2="{ly - 4}" stroke="#1d232a" '
        'stroke-dasharray="5 4"/>'
    )
    body.append(
        f'<text x="{lx + 17}" y="{ly}">target: {target:.0f} MiB each way (replaced + '
        "metadata + two parts)</text>"
    )
    ly += 18
    return svg(left + pw + 30, int(ly + 4), body, title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("data", help="a benchmarks/run.py result (docs/benchmarks-data.json)")
    ap.add_argument("--out", default="docs/img", help="directory of the SVG files")
    args = ap.parse_args()
    data = json.loads(Path(args.data).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "bench-time.svg": series_figure(
            data, "wall_s", "wall time, s (log)", "Time against model size", ylog=True
        ),
        "bench-space.svg": series_figure(
            data,
            "new_space_mib",
            "new disk space, MiB",
            "New disk space against model size",
            ylog=False,
        ),
    }
    if "s3_copy" in data:
        figures["bench-s3.svg"] = s3_figure(data)
    for name, text in figures.items():
        (out / name).write_text(text)
        print(f"{out / name}: {len(text)} bytes")


if __name__ == "__main__":
    main()
