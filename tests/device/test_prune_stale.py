"""``ptestore cache prune --stale`` (``ptestore.device.prune_stale``): entries whose
source is gone or changed are removed, current ones kept; a dry run removes nothing; an
entry a running ``ensure`` holds is never removed; an in-place entry goes without its
file; an entry fetched from a job index is stale once the index no longer names it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import copy_pte, get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries, prune_stale
from ptestore.device.cache import CacheLayout
from ptestore.errors import ConfigurationError, ObjectNotFound

SPEC = "support.counting_backend:Counting=1.0"
FLEET_SPEC = "support.fleet_backend:Scaler=1.0"
EXT = get_fixture("mlp_xnnpack_ext")
A = DeviceProfile("a", {"soc": "x", "scale": 2.0})


def _model(tmp: Path, name: str) -> Path:
    return copy_pte(tmp / name)


def _three(tmp: Path) -> tuple[Path, dict[str, Any]]:
    """A cache with three copy entries: ``gone`` (its source deleted), ``changed`` (its
    source rewritten) and ``current``."""
    cache = tmp / "cache"
    keys = {}
    for name in ("gone", "changed", "current"):
        keys[name] = ptestore.ensure(_model(tmp, f"{name}.pte"), cache_dir=cache, backends=[SPEC])
    (tmp / "gone.pte").unlink()
    data = (tmp / "changed.pte").read_bytes()
    (tmp / "changed.pte").write_bytes(data + b"\0" * 16)
    return cache, keys


def test_stale_copies_are_removed_current_ones_kept_and_a_dry_run_removes_nothing(
    tmp_path: Path,
) -> None:
    cache, made = _three(tmp_path)
    gone, changed, current = made["gone"].key, made["changed"].key, made["current"].key
    dry = prune_stale(cache, dry_run=True)
    assert dry.current == 1 and dry.removed == [] and dry.freed == 0
    by_key = {e.key: e for e in dry.entries}
    assert set(by_key) == {gone, changed}
    assert {e.action for e in dry.entries} == {"would remove"}
    assert by_key[gone].reason == f"its source {tmp_path / 'gone.pte'} is gone"
    assert by_key[changed].reason == (
        f"its source {tmp_path / 'changed.pte'} changed (ctime_ns, mtime_ns, size)"
    )
    assert by_key[gone].bytes > 0
    assert len(list_entries(cache)) == 3  # nothing removed

    done = prune_stale(cache)
    assert sorted(done.removed) == sorted([gone, changed]) and done.current == 1
    assert done.freed == sum(e.bytes for e in dry.entries)
    assert [e.key for e in list_entries(cache)] == [current]
    assert not (cache / "locks" / f"{gone}.lock").exists()
    # The current entry is still a hit.
    again = ptestore.ensure(tmp_path / "current.pte", cache_dir=cache, backends=[SPEC])
    assert not again.created and again.key == current


def test_an_entry_a_running_ensure_holds_is_busy_not_removed(tmp_path: Path) -> None:
    cache, made = _three(tmp_path)
    gone = made["gone"].key
    with CacheLayout(cache).lock(gone, shared=True):  # what ensure holds while it looks
        done = prune_stale(cache)
    assert done.busy == [gone]
    assert [e.reason for e in done.entries if e.key == gone] == [
        f"its source {tmp_path / 'gone.pte'} is gone"
    ]
    assert (cache / "entries" / gone / "manifest.json").exists()
    assert prune_stale(cache).removed == [gone]


def test_an_in_place_entry_goes_without_its_file(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    src = _model(tmp_path, "inplace.pte")
    made = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], in_place=True)
    assert made.in_place
    assert prune_stale(cache).entries == []  # current
    with open(src, "r+b") as f:  # changed behind the cache's back
        f.seek(0, os.SEEK_END)
        f.write(b"\0" * 8)
    done = prune_stale(cache)
    assert done.removed == [made.key]
    assert done.entries[0].reason.startswith(f"its source {src} changed (")
    assert src.exists() and list_entries(cache) == []


def test_a_remote_source_changed_or_gone(tmp_path: Path) -> None:
    """fsspec's memory store reports no ETag: the identity is the SHA-256 of the object."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = "memory://prune-stale-test/model.pte"
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    data = bytearray(fx.pte_path.read_bytes())
    fs.pipe(url, bytes(data))
    cache = tmp_path / "cache"
    try:
        made = ptestore.ensure(url, cache_dir=cache, backends=[SPEC])
        assert prune_stale(cache).entries == []
        data[-1] ^= 1
        fs.pipe(url, bytes(data))
        [e] = prune_stale(cache, dry_run=True).entries
        assert (e.key, e.reason) == (made.key, f"its source {url} changed (sha256)")
        fs.rm(url)
        [e] = prune_stale(cache).entries
        assert (e.reason, e.action) == (f"its source {url} is gone", "removed")
    finally:
        if fs.exists(url):
            fs.rm(url)


def test_a_source_that_cannot_be_judged_is_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert main(["fleet", "run", str(_job(tmp_path, 2.0)), "--workers", "1", "-q"]) == 0
    index = tmp_path / "out" / "ptestore-index.json"
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    index.write_bytes(b"{damaged")
    [e] = prune_stale(cache).entries
    assert (e.key, e.action) == (made.key, "kept: unknown")
    assert e.reason.startswith(f"its index {index} could not be read: {index}: index = ")
    assert [x.key for x in list_entries(cache)] == [made.key]


def _job(tmp: Path, scale: float) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{FLEET_SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        f'[devices.a]\nsoc = "x"\nscale = {scale}\n'
    )
    return job


def test_an_entry_from_an_index_is_stale_once_the_index_names_another_or_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    assert main(["fleet", "run", str(_job(tmp_path, 2.0)), "--workers", "1", "-q"]) == 0
    index = tmp_path / "out" / "ptestore-index.json"
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert prune_stale(cache).entries == []
    # A newer run replaces the artifact: the entry's files are no longer the index's.
    assert main(["fleet", "run", str(_job(tmp_path, 3.0)), "--workers", "1", "-q"]) == 0
    dry = prune_stale(cache, dry_run=True)
    assert [(e.key, e.source, e.action) for e in dry.entries] == [
        (made.key, str(index), "would remove")
    ]
    assert dry.entries[0].reason == (
        f"its index {index} no longer names the artifact it holds (model 'm', "
        f"{tmp_path / 'out' / 'a' / 'm.pte'}): dropped, retired or replaced"
    )
    # Fetched again by the device as the newer run knows it (select hands a device its
    # own build only for the options it was made with), current again; then the index is
    # gone.
    a3 = DeviceProfile("a", {"soc": "x", "scale": 3.0})
    assert ptestore.ensure(index, cache_dir=cache, model="m", device=a3).key == made.key
    assert prune_stale(cache).entries == []
    index.unlink()
    done = prune_stale(cache)
    assert done.removed == [made.key]
    assert done.entries[0].reason == f"its index {index} is gone"


def test_cli_prune_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache, made = _three(tmp_path)
    gone = made["gone"].key
    argv = ["cache", "prune", "--cache-dir", str(cache), "--stale"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "would remove 2 stale entries; 1 current"
    assert any(
        line.startswith(f"would remove       {gone}") and line.endswith("gone.pte is gone")
        for line in out
    ), out
    assert len(list_entries(cache)) == 3
    # A half-made entry goes too (what prune always removes).
    (cache / "entries" / ("0" * 32)).mkdir()
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["stale"]["removed"]) == sorted([gone, made["changed"].key])
    assert sorted(report["removed"]) == sorted([gone, made["changed"].key, "0" * 32])
    assert [e.key for e in list_entries(cache)] == [made["current"].key]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dry-run"], "--dry-run lists what --stale would remove: add --stale"),
        (
            ["--stale", "--dry-run", "--max-bytes", "1M"],
            "--dry-run lists stale entries; it does not plan --max-bytes eviction: "
            "leave out one of them",
        ),
        (
            ["-o", "anon=true"],
            "--storage-option reaches the job indexes of `cache prune --stale` only",
        ),
    ],
)
def test_cli_prune_stale_bad_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    (tmp_path / "cache").mkdir()
    assert main(["cache", "prune", "--cache-dir", str(tmp_path / "cache"), *extra]) == 2
    assert capsys.readouterr().err == f"ptestore cache: error: {message}\n"


def test_cli_stale_with_another_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cache").mkdir()
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "cache"), "--stale"]) == 2
    assert capsys.readouterr().err == (
        "ptestore cache: error: --stale applies to `cache prune`, not `cache ls`\n"
    )


def test_prune_stale_arguments(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=r"/nowhere: no such cache directory$"):
        prune_stale(tmp_path / "nowhere")
    with pytest.raises(ConfigurationError, match=r"^dry_run must be True or False, got 1$"):
        prune_stale(tmp_path, dry_run=1)  # type: ignore[arg-type]
