"""The pages' script and style are package data (``ptestore/viz/assets/``): shipped in
the wheel, read only when a page is drawn, and embedded inline (the page stays one
self-contained file)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ptestore.viz.layout import layout_html
from ptestore.viz.resources import asset

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "ptestore" / "viz" / "assets"
EXAMPLE = ROOT / "tests" / "fixtures" / "mlp_xnnpack.pte"


def test_the_wheel_ships_every_asset(tmp_path: Path) -> None:
    names = sorted(p.name for p in ASSETS.iterdir())
    assert names == ["layout.css", "layout.js", "matrix.css", "matrix.js"]
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(
        ROOT / "ptestore", tree / "ptestore", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(tree),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("ptestore-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("ptestore/viz/assets/")}
        assert shipped == {f"ptestore/viz/assets/{n}" for n in names}
        for n in names:
            assert z.read(f"ptestore/viz/assets/{n}") == (ASSETS / n).read_bytes()


def test_assets_are_read_when_a_page_is_drawn_not_at_import() -> None:
    code = (
        "import sys, ptestore.viz, ptestore.viz.layout, ptestore.viz.matrix\n"
        "from ptestore.viz.resources import asset\n"
        "print('importlib.resources' in sys.modules, asset.cache_info().currsize)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0"]


def test_the_page_embeds_its_script_and_style_inline() -> None:
    html = layout_html(str(EXAMPLE))
    script, style = asset("layout.js"), asset("layout.css")
    assert 'document.body.setAttribute("data-ready", "1")' in script
    assert f"<script>{script}</script>" in html
    assert style in html and ".file h2" in style


def test_a_compared_artifact_is_local_as_storage_says() -> None:
    """Shared extents (FIEMAP) are looked up for a local artifact only, whatever its
    spelling: the one URL classification of ``ptestore.storage.types``."""
    from ptestore.viz.layout import _local_path

    assert _local_path("/data/a.pte") == "/data/a.pte"
    assert _local_path("file:///data/a.pte") == "/data/a.pte"
    assert _local_path("FILE:///data/a.pte") == "/data/a.pte"
    assert _local_path("local:///data/a.pte") == "/data/a.pte"
    assert _local_path("rel/a.pte") == os.path.abspath("rel/a.pte")
    for remote in ("s3://bucket/a.pte", "memory://a.pte", "gs://bucket/a.pte"):
        assert _local_path(remote) is None, remote
