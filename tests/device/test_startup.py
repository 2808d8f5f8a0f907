"""Start-up on the device path (issue 17): what a fresh interpreter imports for a local
``ensure`` cache hit and a local ``specialize``, and the snapshot of the installed
metadata (``ptestore.backends.snapshot``) that lets a hit skip ``importlib.metadata``
without ever serving an entry made by another backend version.

Module sets, not timings (the timings are in benchmarks/bench_startup.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fixtures import copy_pte

import ptestore
from ptestore.backends.snapshot import Snapshot, environment_stamp

#: What a local run must not import (numpy: no backend here uses it).
HEAVY = ("fsspec", "asyncio", "tenacity", "s3fs", "tqdm", "numpy", "awscrt")

PROBE = """\
import json, sys
from ptestore.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


#: The tree of the ptestore under test: a fresh interpreter imports it, not the one an
#: editable install points at (a worktree's tests measured main's code).
TREE = Path(ptestore.__file__).resolve().parents[1]


def _fresh(argv: list[str], cwd: Path, pythonpath: Path | None = None) -> tuple[dict, str]:
    """Run ``ptestore ARGV`` in a fresh interpreter; (its probe record, its stdout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath, TREE) if p is not None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["status"] == 0
    return record, done.stdout


def _model(tmp_path: Path) -> Path:
    return copy_pte(tmp_path / "model.pte")


def test_a_local_ensure_hit_imports_nothing_heavy_nor_the_metadata(tmp_path: Path) -> None:
    src, cache = _model(tmp_path), tmp_path / "cache"
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", "passthrough", "--json"]
    first, out = _fresh(argv, tmp_path)
    assert json.loads(out)["created"] is True
    # nothing logged, so no logging (the command's form of a warning costs nothing then)
    assert [m for m in (*HEAVY, "logging") if m in first["modules"]] == []
    assert environment_stamp() is not None  # nothing installed in the last seconds
    assert (cache / "backends.json").is_file()
    hit, out = _fresh(argv, tmp_path)
    assert json.loads(out)["created"] is False
    assert [m for m in (*HEAVY, "importlib.metadata", "logging") if m in hit["modules"]] == []
    # a hit reads no container and builds only the parser of `ensure`
    assert [m for m in hit["modules"] if m.startswith("ptestore.format")] == []
    assert "ptestore.cli.specialize" not in hit["modules"]


def test_a_hit_with_the_default_backends_reads_no_metadata_either(tmp_path: Path) -> None:
    src, cache = _model(tmp_path), tmp_path / "cache"
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--json"]
    _fresh(argv, tmp_path)
    hit, out = _fresh(argv, tmp_path)
    assert json.loads(out)["created"] is False
    assert [m for m in (*HEAVY, "importlib.metadata") if m in hit["modules"]] == []


#: What a local passthrough does not need, so does not import: the installed metadata
#: (``passthrough`` is ptestore's own, its version is in the code), the remote loader and
#: the retry policy, logging (nothing configured it), the provenance stamper, record and
#: clock without provenance, tensor descriptions (no backend asked; the check of the
#: .pte's own values reads their sizes only, ``ptestore.format.sizes``), tempfile (the spool
#: is an ``O_TMPFILE``), shutil (argparse's terminal width), hashlib (no replacement, no
#: journal, no trailer), dataclasses and inspect (ptestore's classes are made by
#: ``ptestore._dataclass``: 25 ms).
LOCAL_RUN_SKIPS = (
    "importlib.metadata",
    "dataclasses",
    "inspect",
    "logging",
    "ptestore._retry",
    "ptestore.storage.remote",
    "ptestore.format.tensorinfo",
    "ptestore.format.tensors",
    "tempfile",
    "shutil",
    "datetime",
)
NO_PROVENANCE_SKIPS = ("ptestore.provenance.stamp", "ptestore.provenance.record", "hashlib")


def test_a_local_passthrough_specialize_imports_only_what_it_uses(tmp_path: Path) -> None:
    src = _model(tmp_path)
    argv = ["specialize", str(src), str(tmp_path / "out.pte"), "--backend", "passthrough"]
    record, _ = _fresh([*argv, "--quiet", "--no-provenance"], tmp_path)
    assert (tmp_path / "out.pte").is_file()
    imported = record["modules"]
    assert [m for m in (*HEAVY, *LOCAL_RUN_SKIPS, *NO_PROVENANCE_SKIPS) if m in imported] == []
    assert "ptestore.format.sizes" in imported  # its values were checked (it holds them)
    # the command line's default: a provenance trailer, still without the metadata
    record, _ = _fresh([*argv, "--quiet"], tmp_path)
    assert "ptestore.provenance.stamp" in record["modules"]
    assert [m for m in (*HEAVY, *LOCAL_RUN_SKIPS) if m in record["modules"]] == []


def _install(site: Path, version: str, old: float) -> Path:
    """A distribution ``npu-backend`` VERSION providing the entry point ``npu`` (a
    passthrough whose version is its distribution's), its metadata dated ``old``."""
    for stale in site.glob("npu_backend-*.dist-info"):
        shutil.rmtree(stale)
    info = site / f"npu_backend-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: npu-backend\nVersion: {version}\n"
    )
    (info / "top_level.txt").write_text("npu_backend\n")
    (info / "entry_points.txt").write_text("[ptestore.backends]\nnpu = npu_backend:Npu\n")
    module = site / "npu_backend.py"
    module.write_text(
        "from ptestore.backends.passthrough import PassthroughBackend\n\n\n"
        "class Npu(PassthroughBackend):\n    pass\n"
    )
    for path in (*info.iterdir(), info, module):
        os.utime(path, (old, old))  # older than the snapshot's racy window
    return info


def test_a_changed_backend_version_makes_the_entry_stale_in_the_next_process(
    tmp_path: Path,
) -> None:
    site, cache = tmp_path / "site", tmp_path / "cache"
    src = _model(tmp_path)
    info = _install(site, "1.0", old=1_600_000_000)
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", "npu", "--json"]

    def run() -> dict:
        record, out = _fresh(argv, tmp_path, pythonpath=site)
        result: dict = json.loads(out)
        result["metadata read"] = "importlib.metadata" in record["modules"]
        return result

    made = run()
    assert made["created"] is True and made["metadata read"] is True
    assert made["provenance"]["requested"] == [{"spec": "npu", "version": "1.0"}]
    hit = run()
    assert hit["created"] is False and hit["metadata read"] is False  # from the snapshot

    # an upgrade: a new metadata directory
    _install(site, "2.0", old=1_600_000_100)
    upgraded = run()
    assert upgraded["created"] is True and upgraded["metadata read"] is True
    assert upgraded["provenance"]["requested"] == [{"spec": "npu", "version": "2.0"}]
    assert run()["created"] is False

    # the same directory, its METADATA rewritten in place (an editable project's
    # egg_info does this)
    info = site / "npu_backend-2.0.dist-info"
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.0", "Version: 2.1"))
    os.utime(meta, (1_600_000_200, 1_600_000_200))
    edited = run()
    assert edited["created"] is True
    assert edited["provenance"]["requested"] == [{"spec": "npu", "version": "2.1"}]


def test_metadata_changed_in_the_last_seconds_is_not_trusted(tmp_path: Path) -> None:
    site, cache = tmp_path / "site", tmp_path / "cache"
    src = _model(tmp_path)
    info = _install(site, "1.0", old=1_600_000_000)
    # Inside the racy window for the whole test, however long its two fresh processes
    # take on a busy machine: "modified in the last RACY_SECONDS" is any mtime later
    # than now - RACY_SECONDS, one in the future included (a touch, then two process
    # start-ups of more than 2 s at load 10, once left the window and failed).
    later = time.time() + 3600
    os.utime(info / "METADATA", (later, later))
    argv = ["ensure", str(src), "--cache-dir", str(cache), "--backend", "npu"]
    for _ in range(2):
        record, _ = _fresh(argv, tmp_path, pythonpath=site)
        assert "importlib.metadata" in record["modules"]
    assert not (cache / "backends.json").exists()


def test_a_snapshot_of_another_installation_or_a_damaged_one_is_ignored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "backends.json"
    path.write_text(
        json.dumps(
            {
                "format": "ptestore.backends-snapshot/1",
                "stamp": ["another interpreter"],
                "facts": {"entry_points": {"passthrough": "x:Y"}, "versions": {}},
            }
        )
    )
    snap = Snapshot.load(str(path))
    assert snap.entry_points is None and snap.versions == {}
    path.write_text("{not json")
    assert Snapshot.load(str(path)).entry_points is None


def test_no_stamp_while_another_finder_provides_distributions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Finder:  # distributions from somewhere the stamp does not look
        def find_spec(self, *args: object) -> None:
            return None

        def find_distributions(self, *args: object) -> list[object]:
            return []

    assert environment_stamp() is not None
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    assert environment_stamp() is None


def test_the_importlib_metadata_backport_keeps_the_stamp() -> None:
    # dask imports the backport, which puts its own finder in sys.meta_path: it reads
    # the same metadata directories on sys.path, so the stamp still covers them.
    import importlib_metadata  # in the test environment (dask's dependency)

    assert importlib_metadata.MetadataPathFinder in map(type, sys.meta_path)
    assert environment_stamp() is not None
