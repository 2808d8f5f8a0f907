"""The layout map (``ptestore inspect --html``) in a real browser: opened from file://,
no console error, no request, one element per region with its label, selecting a
segment shows its details, the screenshot is not blank; --compare, --ptd, remote URLs,
the provenance trailer, and a 4 GiB program with 130 segments."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
from support.browser import Browser, distinct_colours
from support.large import ReplaceKey

import ptestore
from ptestore.cli import main
from ptestore.viz.layout import (
    FileMap,
    compare_regions,
    layout_html,
    layout_regions,
    render_layout,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mlp_xnnpack.pte"
FIXTURES = ROOT / "tests" / "fixtures"


def _check_page(browser: Browser, path: Path) -> float:
    """Open ``path``: ready, no console error, no request but the page itself."""
    seconds = browser.open(path)
    assert browser.console_errors() == []
    assert browser.requests(path) == [path.resolve().as_uri()]
    return seconds


def _regions(browser: Browser, map_index: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = browser.js(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => ({"
        "id: e.dataset.id, kind: e.dataset.kind, label: e.dataset.label,"
        "status: e.dataset.status, category: e.dataset.category,"
        "zero: e.classList.contains('zero'), width: e.getBBox().width, x: e.getBBox().x}))",
        f"#map-{map_index} rect.region",
    )
    return out


def test_layout_map_of_the_example_in_a_browser(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "map.html"
    assert main(["inspect", str(EXAMPLE), "--html", str(page)]) == 0
    desc = ptestore.describe(EXAMPLE)
    _check_page(browser, page)

    rects = _regions(browser, 0)
    segments = [r for r in rects if r["kind"] == "segment"]
    assert len(segments) == len(desc["segments"])
    labels = [r["label"] for r in segments]
    for row in desc["named_data"]:
        assert sum(f"key {row['key']}" in label for label in labels) == 1, row["key"]
    assert any("delegate forward[0] XnnpackBackend" in label for label in labels)
    kinds = [r["kind"] for r in rects]
    assert kinds[:2] == ["header", "metadata"]
    # to scale: the widths add up to the drawing's width and follow the byte counts
    assert sum(r["width"] for r in rects if not r["zero"]) == (pytest.approx(1000, abs=2))
    big = max(desc["segments"], key=lambda s: s["size"])
    (rect,) = [r for r in segments if r["label"].startswith(f"segment {big['index']}:")]
    assert rect["width"] == pytest.approx(1000 * big["size"] / desc["file_size"], rel=0.01)

    # selecting a weight shows its key, dtype, shape, alignment, offsets and users
    row = next(r for r in desc["named_data"] if r["tensor_info"])
    seg = desc["segments"][row["segment_index"]]
    (target,) = [r for r in segments if r["label"].startswith(f"segment {seg['index']}:")]
    browser.js(
        "document.querySelector(`rect[data-id='${arguments[0]}']`)"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))",
        target["id"],
    )
    details = browser.js("return document.getElementById('details').innerText")
    shape = ", ".join(str(d) for d in row["tensor_info"]["shape"])
    assert row["key"] in details
    assert f"{row['tensor_info']['dtype']} [{shape}]" in details
    assert (
        f"alignment\t{seg['alignment']}" in details or f"alignment\n{seg['alignment']}" in details
    )
    start, end = seg["absolute_offset"], seg["absolute_offset"] + seg["size"]
    assert f"[{start}, {end})" in details
    assert f"offset {seg['offset']} from the segment base" in details
    assert browser.js("return document.querySelectorAll('.selected').length") == 2  # bar + row

    # readable mode widens tiny regions: every region at least 3 units wide but zero ones
    browser.js("document.querySelector('input[value=readable]').click()")
    widths = [r["width"] for r in _regions(browser, 0) if not r["zero"]]
    assert min(widths) >= 3
    shot = browser.screenshot(tmp_path / "map.png")
    width, height, colours = distinct_colours(browser, shot)
    assert width > 600 and height > 300
    assert colours > 20  # text, bars in several colours: not a blank page


def _specialized(tmp_path: Path, src: Path, extra: int) -> tuple[Path, dict[str, Any]]:
    desc = ptestore.describe(src)
    key = desc["named_data"][0]["key"]
    dst = tmp_path / f"spec-{extra}.pte"
    report = ptestore.specialize(
        src, dst, backends=[ReplaceKey("XnnpackBackend", key, extra=extra)], provenance=True
    )
    assert report.specialized
    return dst, desc


def test_compare_marks_grown_moved_unchanged(browser: Browser, tmp_path: Path) -> None:
    src = FIXTURES / "mlp_xnnpack.pte"
    dst, desc = _specialized(tmp_path, src, extra=512)
    key = desc["named_data"][0]["key"]
    page = tmp_path / "compare.html"
    assert main(["inspect", str(dst), "--html", str(page), "--compare", str(src)]) == 0
    _check_page(browser, page)
    source, artifact = _regions(browser, 0), _regions(browser, 1)
    by_label = {r["label"]: r for r in artifact if r["kind"] == "segment"}
    (grown,) = [r for label, r in by_label.items() if f"key {key}" in label]
    assert grown["status"] == "grown"
    others = [r["status"] for r in by_label.values() if r is not grown and not r["zero"]]
    assert others and set(others) <= {"unchanged", "moved"}
    # the segments after the grown one moved; the ones before did not
    assert "moved" in others and "unchanged" in others
    assert [r["status"] for r in source if r["kind"] == "segment"].count("grown") == 1
    # the specialized file ends with its provenance trailer, drawn last, inside the bar
    assert artifact[-1]["kind"] == "trailer"
    trailer = artifact[-1]
    assert trailer["width"] > 0 and trailer["x"] + trailer["width"] <= 1000.0 + 1e-3
    assert trailer["x"] + trailer["width"] >= 1000.0 - 1e-3  # it ends where the file does
    # the label is the file's real size, trailer included
    size = dst.stat().st_size
    heads = browser.js(
        "return Array.from(document.querySelectorAll('section.file .muted')).map(e => e.innerText)"
    )
    assert f"({size} bytes)" in heads[1], heads
    assert f"({src.stat().st_size} bytes)" in heads[0], heads
    # a comparison opens coloured by change: the grown segment has the grown colour
    assert browser.js("return document.querySelector('input[value=status]').checked") is True
    assert browser.js("return document.getElementById('legend-status').hidden") is False
    assert browser.js("return document.getElementById('legend-user').hidden") is True
    opening = browser.js(
        "return document.querySelector(`rect[data-id='${arguments[0]}']`).getAttribute('fill')",
        grown["id"],
    )
    assert opening == "#b3308c"
    browser.js(
        "document.querySelector(`rect[data-id='${arguments[0]}']`)"
        ".dispatchEvent(new MouseEvent('click'))",
        artifact[-1]["id"],
    )
    details = browser.js("return document.getElementById('details').innerText")
    assert "provenance trailer" in details and f"source {src}" in details
    browser.js(
        "document.querySelector(`rect[data-id='${arguments[0]}']`)"
        ".dispatchEvent(new MouseEvent('click'))",
        grown["id"],
    )
    details = browser.js("return document.getElementById('details').innerText")
    assert "grown" in details and "(source: [" in details
    # colour by user, and back by change
    browser.js("document.querySelector('input[value=user]').click()")
    fill = browser.js(
        "return document.querySelector(`rect[data-id='${arguments[0]}']`).getAttribute('fill')",
        grown["id"],
    )
    assert fill != "#b3308c"
    assert browser.js("return document.getElementById('legend-user').hidden") is False
    browser.js("document.querySelector('input[value=status]').click()")
    fill = browser.js(
        "return document.querySelector(`rect[data-id='${arguments[0]}']`).getAttribute('fill')",
        grown["id"],
    )
    assert fill == "#b3308c"


def test_compare_same_size_replacement_and_clone_ranges() -> None:
    """Pure model: same size new bytes -> replaced; same bytes inside a shared (reflinked)
    range -> cloned; a segment with no counterpart -> new."""
    desc = ptestore.describe(FIXTURES / "mlp_xnnpack.pte")
    src = layout_regions(desc)
    dst = layout_regions(json.loads(json.dumps(desc)))
    segs = [r for r in dst if r["kind"] == "segment" and r["size"]]
    hashes = {r["segment"]: str(r["segment"]) for r in segs}
    changed = dict(hashes)
    changed[segs[0]["segment"]] = "other bytes"
    shared = [(segs[1]["start"], segs[1]["start"] + segs[1]["size"])]
    compare_regions(src, dst, hashes, changed, shared)
    status = {r["segment"]: r["status"] for r in segs}
    assert status[segs[0]["segment"]] == "replaced"
    assert status[segs[1]["segment"]] == "cloned"
    assert {status[r["segment"]] for r in segs[2:]} == {"unchanged"}
    lonely = layout_regions({**desc, "named_data": [], "delegates": []})
    compare_regions(src, lonely)
    assert {r["status"] for r in lonely if r["kind"] == "segment" and r["size"]} == {"new"}


def test_pair_and_remote_url(browser: Browser, tmp_path: Path) -> None:
    """--ptd draws the pair; a memory:// URL (any fsspec URL) draws the same regions."""
    pte, ptd = FIXTURES / "mlp_xnnpack_ext.pte", FIXTURES / "mlp_xnnpack_ext.ptd"
    fs = fsspec.filesystem("memory")
    fs.pipe({"/viz/m.pte": pte.read_bytes(), "/viz/m.ptd": ptd.read_bytes()})
    page = tmp_path / "pair.html"
    code = main(
        ["inspect", "memory:///viz/m.pte", "--ptd", "memory:///viz/m.ptd", "--html", str(page)]
    )
    assert code == 0
    _check_page(browser, page)
    ptd_desc = ptestore.describe(ptd)
    ptd_rects = _regions(browser, 1)
    assert next(r["kind"] for r in ptd_rects) == "header"
    segments = [r for r in ptd_rects if r["kind"] == "segment"]
    assert len(segments) == len(ptd_desc["segments"])
    for row in ptd_desc["named_data"]:
        assert any(f"key {row['key']}" in r["label"] for r in segments)
    local = layout_html(str(pte), ptd=str(ptd))
    remote = page.read_text()
    assert local.count('class="region') == remote.count('class="region') > 0
    fs.rm("/viz", recursive=True)


def test_html_pair_is_checked_as_inspect_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--html --ptd refuses a .pte given as the .ptd (as inspect --ptd does), and
    --compare-ptd needs --ptd; nothing is written."""
    page = tmp_path / "p.html"
    assert main(["inspect", str(EXAMPLE), "--ptd", str(EXAMPLE), "--html", str(page)]) == 2
    err = capsys.readouterr().err
    assert "expected a .pte and a .ptd, found a .pte as the .ptd" in err
    argv = ["inspect", str(EXAMPLE), "--compare-ptd", str(EXAMPLE), "--html", str(page)]
    assert main(argv) == 2
    assert "compare_ptd (--compare-ptd) needs ptd (--ptd PTD)" in capsys.readouterr().err
    assert not page.exists()


def test_compare_without_html_is_text(capsys: pytest.CaptureFixture[str]) -> None:
    """--compare alone prints the comparison (tests/cli/test_inspect.py has the rest);
    --compare-ptd alone is refused."""
    assert main(["inspect", str(EXAMPLE), "--compare", str(EXAMPLE)]) == 0
    assert f"{EXAMPLE} compared with its source {EXAMPLE}\n" in capsys.readouterr().out
    assert main(["inspect", str(EXAMPLE), "--compare-ptd", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err
    assert "--compare-ptd SRC_PTD needs --compare SRC (or --html FILE)" in err


def test_html_of_a_missing_file_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "x.html"
    assert main(["inspect", str(tmp_path / "nope.pte"), "--html", str(page)]) == 2
    assert "nope.pte" in capsys.readouterr().err
    assert not page.exists()


def synthetic_description(size: int = 4 << 30, count: int = 130) -> dict[str, Any]:
    """A describe() object of a 4 GiB .pte with ``count`` segments: a few big weights,
    many tiny ones (biases, scales), one delegate blob and an unreferenced one."""
    base = 64 << 10
    sizes = []
    for i in range(count):
        sizes.append(64 if i % 3 == 0 else (4096 if i % 3 == 1 else 0))
    big = (size - base - (count << 12) - sum(sizes)) // sum(1 for s in sizes if s == 0)
    sizes = [s or big for s in sizes]
    segments, named, offset = [], [], 0
    for i, n in enumerate(sizes):
        offset = (offset + 4095) // 4096 * 4096
        segments.append(
            {
                "index": i,
                "offset": offset,
                "size": n,
                "absolute_offset": base + offset,
                "alignment": 4096,
                "offset_present": True,
                "size_present": True,
            }
        )
        if i not in (0, count - 1):
            named.append(
                {
                    "key": f"layer{i:03d}.weight",
                    "segment_index": i,
                    "size": n,
                    "tensor_info": {"dtype": "float32", "shape": [n // 4]},
                }
            )
        offset += n
    end = base + offset
    return {
        "format": "pte",
        "source": "synthetic",
        "file_size": end,
        "header": {
            "length": 32,
            "program_size": 40000,
            "segment_base_offset": base,
            "segment_data_size": offset,
        },
        "metadata_size": 40000,
        "methods": ["forward"],
        "segments": segments,
        "named_data": named,
        "delegates": [
            {
                "method": "forward",
                "id": "XnnpackBackend",
                "location": "segment",
                "index": 0,
                "compile_specs": [],
            }
        ],
        "constant_segment": None,
        "mutable_data_segments": [],
        "warnings": [],
    }


def test_a_4gib_program_with_130_segments_stays_usable(browser: Browser, tmp_path: Path) -> None:
    desc = synthetic_description()
    assert desc["file_size"] > 4 * 10**9 and len(desc["segments"]) == 130
    t0 = time.perf_counter()
    html = render_layout(
        [FileMap("synthetic 4 GiB", "synthetic.pte", desc["file_size"], layout_regions(desc))]
    )
    build = time.perf_counter() - t0
    page = tmp_path / "large.html"
    page.write_text(html)
    seconds = _check_page(browser, page)
    rects = _regions(browser, 0)
    assert sum(r["kind"] == "segment" for r in rects) == 130
    # most segments are under a pixel to scale, so the page opens in readable mode
    assert browser.js("return document.querySelector('input[value=readable]').checked")
    assert min(r["width"] for r in rects if not r["zero"]) >= 3
    tiny = next(r for r in rects if r["label"].startswith("segment 3:"))
    browser.js(
        "document.querySelector(`rect[data-id='${arguments[0]}']`)"
        ".dispatchEvent(new MouseEvent('click'))",
        tiny["id"],
    )
    assert "layer003.weight" in browser.js("return document.getElementById('details').innerText")
    print(
        f"4 GiB, 130 segments: page {len(html)} bytes, built in {build:.3f} s, "
        f"ready in the browser in {seconds:.3f} s"
    )


def test_pages_are_self_contained() -> None:
    html = layout_html(str(EXAMPLE))
    for needle in ("http://", "https://", "<link", "src=", "@import", "url("):
        assert needle not in html.replace("http://www.w3.org/2000/svg", ""), needle


def test_html_into_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "no" / "map.html"
    assert main(["inspect", str(EXAMPLE), "--html", str(page)]) == 2
    err = capsys.readouterr().err
    assert f"--html {page}: the directory {page.parent} does not exist" in err


def test_ptd_rows_show_their_tensor_layout() -> None:
    """A .ptd key shows dtype and shape from its tensor info, else from its layout."""
    desc = ptestore.describe(FIXTURES / "mlp_portable_ext.ptd")
    row = next(r for r in desc["named_data"] if r["key"] == "fc1.weight")
    (seg,) = [r for r in layout_regions(desc) if r.get("keys") == ["fc1.weight"]]
    assert seg["tensors"] == [{"dtype": "float32", "shape": [32, 16]}]
    row["tensor_info"] = None
    (seg,) = [r for r in layout_regions(desc) if r.get("keys") == ["fc1.weight"]]
    assert seg["tensors"] == [{"dtype": "float32", "shape": row["tensor_layout"]["sizes"]}]


class _CountedRegions(list):  # type: ignore[type-arg]
    """A region list that counts the passes made over it."""

    passes = 0

    def __iter__(self) -> Any:
        self.passes += 1
        return super().__iter__()


def test_the_page_makes_a_fixed_number_of_passes_over_the_regions() -> None:
    # Not one pass per table row (65,536 tiny segments took many minutes).
    from support import synth

    from ptestore.format import parse
    from ptestore.inspection import describe

    def passes(n: int) -> int:
        data = synth.overlapping_xnnpack(n, 1, backend="VendorNpuBackend")
        desc = describe(parse(data, len(data), "o.pte"))
        regions = _CountedRegions(layout_regions(desc))
        assert sum(r["kind"] == "segment" for r in regions) == n
        render_layout([FileMap("o.pte", "o.pte", len(data), regions)])
        return regions.passes

    assert passes(64) == passes(512)


def test_many_delegate_backend_ids_keep_their_colours_and_a_short_legend() -> None:
    """Each delegate backend id keeps the colour of its number in order of first use
    (looked up, not searched for: a file of 32,000 ids took 24 s), and the legend names
    the first 16 ids and counts the rest."""
    import flatbuffers
    from support import synth

    from ptestore.format import parse
    from ptestore.inspection import describe
    from ptestore.viz.draw import DELEGATE_COLOURS, LEGEND_BACKENDS

    n = 40
    b = flatbuffers.Builder(0)
    segments = []
    for i in range(n):
        b.StartObject(2)
        b.PrependUint64Slot(0, 8 * i, 0)
        b.PrependUint64Slot(1, 8, 0)
        segments.append(b.EndObject())
    segs = synth.offsets_vector(b, segments)
    delegates = []
    for i in range(n):
        bid = b.CreateString(f"Vendor{i:02d}Backend")
        b.StartObject(2)
        b.PrependUint8Slot(0, 1, 0)
        b.PrependUint32Slot(1, i, 0)
        ref = b.EndObject()
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, bid, 0)
        b.PrependUOffsetTRelativeSlot(1, ref, 0)
        delegates.append(b.EndObject())
    plans = synth.offsets_vector(b, [synth.plan(b, "forward", synth.offsets_vector(b, delegates))])
    data = synth.with_segments(synth.finish_program(b, plans, segments=segs), bytes(8 * n))
    desc = describe(parse(data, len(data), "o.pte"))
    html = render_layout([FileMap("o.pte", "o.pte", len(data), layout_regions(desc))])
    named = [
        f"delegate Vendor{i:02d}Backend"
        for i in range(n)
        if f"delegate Vendor{i:02d}Backend<" in html
    ]
    assert named == [f"delegate Vendor{i:02d}Backend" for i in range(LEGEND_BACKENDS)]
    assert f"+{n - LEGEND_BACKENDS} more delegate backend ids (hover a region)" in html
    fills = [DELEGATE_COLOURS[i % len(DELEGATE_COLOURS)] for i in range(LEGEND_BACKENDS)]
    for i, fill in enumerate(fills):
        assert f'background:{fill}"></span>delegate Vendor{i:02d}Backend<' in html


def test_only_the_pages_own_script_runs(browser: Browser, tmp_path: Path) -> None:
    """The Content-Security-Policy names the page's one script by its SHA-256 (it said
    'unsafe-inline'): a script that found its way into the body would not run."""
    from ptestore.viz.html import page

    text = page(
        "t",
        '<p id="p">body</p><script>document.getElementById("p").dataset.injected = "1"</script>',
        script='document.getElementById("p").dataset.own = "1"; document.body.dataset.ready = "1";',
    )
    assert "script-src 'unsafe-inline'" not in text and "script-src 'sha256-" in text
    (tmp_path / "p.html").write_text(text)
    browser.open(tmp_path / "p.html")
    dataset = browser.js("return Object.assign({}, document.getElementById('p').dataset)")
    assert dataset == {"own": "1"}
