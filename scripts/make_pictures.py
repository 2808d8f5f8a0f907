"""Make the README's pictures (docs/img/layout-map.png, docs/img/fleet-matrix.png) from the
embedded example and a small fleet job, with the headless system Chromium of the tests.

    .venv/bin/python scripts/make_pictures.py [--out docs/img]

The layout map: ``examples/mlp_xnnpack.pte`` specialized by
``examples.double_first_weight:DoubleFirstWeight`` (with provenance), drawn against its
source, one weight selected. The matrix: that backend over the example and a model whose
source is truncated (each of its pairs fails; a missing source would stop the job in
its preflight), on six devices, after a first run of three of them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.browser import browser_session  # noqa: E402

from ptestore.cli import main as ptestore  # noqa: E402

BACKEND = "examples.double_first_weight:DoubleFirstWeight"
DEVICES = ("pixel-8", "pixel-9", "galaxy-s24", "galaxy-s25", "iphone-15", "rpi-5")


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _job(devices: tuple[str, ...]) -> str:
    text = (
        'destination = "out/{device}/{model}.pte"\n'
        f'backends = ["{BACKEND}"]\n'
        '[[models]]\nname = "mlp-xnnpack"\nsource = "mlp_xnnpack.pte"\n'
        '[[models]]\nname = "mlp-v2"\nsource = "mlp_v2.pte"\n'
        '[[models]]\nname = "llm-draft"\nsource = "llm_draft.pte"\n'
    )
    for d in devices:
        text += f'[devices.{d}]\nsoc = "{d.split("-")[0]}"\n'
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.gettempdir()) / "ptestore-demo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    sys.path.insert(0, str(work))
    try:
        shutil.copytree(ROOT / "examples", work / "examples")
        shutil.copy(ROOT / "examples" / "mlp_xnnpack.pte", work / "mlp_xnnpack.pte")
        shutil.copy(ROOT / "tests" / "fixtures" / "mlp_xnnpack_align4096.pte", work / "mlp_v2.pte")
        # a download cut short: the first 2 KiB of a real program
        example = (ROOT / "examples" / "mlp_xnnpack.pte").read_bytes()
        (work / "llm_draft.pte").write_bytes(example[:2048])
        with _cwd(work):
            assert (
                ptestore(
                    [
                        "specialize",
                        "mlp_xnnpack.pte",
                        "mlp_specialized.pte",
                        "--backend",
                        BACKEND,
                        "--provenance",
                        "-q",
                    ]
                )
                == 0
            )
            assert (
                ptestore(
                    [
                        "inspect",
                        "mlp_specialized.pte",
                        "--compare",
                        "mlp_xnnpack.pte",
                        "--html",
                        "layout.html",
                    ]
                )
                == 0
            )
            Path("job.toml").write_text(_job(DEVICES[:3]))
            ptestore(["fleet", "run", "job.toml", "--workers", "1", "-q"])
            Path("job.toml").write_text(_job(DEVICES))
            ptestore(["fleet", "run", "job.toml", "--workers", "1", "-q", "--report", "fleet.html"])
        session = browser_session()
        browser = next(session)
        try:
            browser.driver.set_window_size(1100, 700)
            browser.open(work / "layout.html")
            browser.js(
                "const r = Array.from(document.querySelectorAll('#map-1 rect.region'))"
                ".find(e => e.dataset.status === 'replaced');"
                "r.dispatchEvent(new MouseEvent('click'))"
            )
            browser.screenshot(out / "layout-map.png")
            browser.driver.set_window_size(1100, 720)
            browser.open(work / "fleet.html")
            browser.js("document.querySelector('td.cell[data-status=failed]').click()")
            browser.screenshot(out / "fleet-matrix.png")
        finally:
            session.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("layout-map.png", "fleet-matrix.png"):
        print(f"{out / name}: {(out / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
