"""``ptestore cache prune --stale`` (``ptestore.device.prune_stale``): entries whose
source is gone or changed are removed, current ones kept; a dry run removes nothing; an
entry a running ``ensure`` holds is never removed; an in-place entry goes without its
file; an entry fetched from a job index is stale once the index no longer names it; a
source, ``.ptd`` or index on a file system that is not mounted is unknown, not gone."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.blocks import allocated_under
from support.fixtures import copy_pte, get_fixture
from support.smallfs import tmpfs

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries, prune_stale
from ptestore.device.layout import CacheLayout
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

    held = {k: allocated_under(cache / "entries" / k) for k in (gone, changed)}
    done = prune_stale(cache)
    assert sorted(done.removed) == sorted([gone, changed]) and done.current == 1
    assert done.freed == sum(held.values())  # the blocks the files held
    assert {e.key: e.bytes for e in done.entries} == held
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
    entry = tmp_path / "cache" / "entries" / ("0" * 32)
    entry.mkdir(parents=True)  # an incomplete entry: prune or clear would remove it
    for action, why in (("clear", " (clear removes every entry)"), ("ls", "")):
        argv = ["cache", action, "--cache-dir", str(tmp_path / "cache"), "--max-bytes", "1G"]
        assert main(argv) == 2 and entry.is_dir()
        assert capsys.readouterr().err == (
            f"ptestore cache: error: --max-bytes applies to `cache prune`, not `cache "
            f"{action}`{why}\n"
        )


def test_prune_stale_arguments(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=r"/nowhere: no such cache directory$"):
        prune_stale(tmp_path / "nowhere")
    with pytest.raises(ConfigurationError, match=r"^dry_run must be True or False, got 1$"):
        prune_stale(tmp_path, dry_run=1)  # type: ignore[arg-type]


@contextmanager
def _bound(disk: Path, mnt: Path) -> Iterator[Callable[[bool], None]]:
    """``disk`` bind-mounted at ``mnt``; the yielded ``mounted(on)`` mounts or unmounts it
    (as a share or a card comes and goes); unmounted at the end whatever happened."""

    def mounted(on: bool) -> None:
        argv = ["mount", "--bind", str(disk), str(mnt)] if on else ["umount", str(mnt)]
        r = subprocess.run(argv, check=False, capture_output=True, text=True)
        assert r.returncode == 0, f"{argv}: {r.stderr} (mounting needs root, as CI runs)"

    mnt.mkdir()
    mounted(True)
    try:
        yield mounted
    finally:
        if os.path.ismount(mnt):
            mounted(False)


def test_a_source_on_a_file_system_not_mounted_is_unknown_not_gone(tmp_path: Path) -> None:
    """The source's file system (a tmpfs bound at ``mnt``: another device than the
    directory below) is not mounted when prune runs: the empty mount point says nothing
    about the file, the entry is kept ``unknown``; mounted again, the same file is a hit.
    A source removed from the mounted file system is still gone."""
    cache = tmp_path / "cache"
    with tmpfs(tmp_path / "disk", "8m") as disk, _bound(disk, tmp_path / "mnt") as mounted:
        mnt = tmp_path / "mnt"
        _model(disk, "model.pte")
        _model(disk, "removed.pte")
        made = ptestore.ensure(mnt / "model.pte", cache_dir=cache, backends=[SPEC])
        removed = ptestore.ensure(mnt / "removed.pte", cache_dir=cache, backends=[SPEC])
        device = (mnt / "model.pte").stat().st_dev
        assert device != tmp_path.stat().st_dev
        mounted(False)
        judged = {e.key: e for e in prune_stale(cache).entries}
        assert {k: e.action for k, e in judged.items()} == {
            made.key: "kept: unknown",
            removed.key: "kept: unknown",
        }
        assert judged[made.key].reason == (
            f"its source {mnt / 'model.pte'} is missing and its file system is not mounted "
            f"(it was on device {device}; the nearest directory there, {mnt}, is on device "
            f"{tmp_path.stat().st_dev})"
        )
        assert {x.key for x in list_entries(cache)} == {made.key, removed.key}
        mounted(True)
        again = ptestore.ensure(mnt / "model.pte", cache_dir=cache, backends=[SPEC])
        assert (again.key, again.created) == (made.key, False)
        (disk / "removed.pte").unlink()  # gone from a mounted file system: stale
        done = prune_stale(cache)
        assert done.removed == [removed.key]
        assert done.entries[0].reason == f"its source {mnt / 'removed.pte'} is gone"


def test_a_ptd_and_an_index_on_a_file_system_not_mounted_are_unknown(tmp_path: Path) -> None:
    """The same for a copy's ``.ptd`` (its ``.pte`` on the root file system) and for the
    job index an entry was fetched from (the manifest records the index's device)."""
    assert EXT.ptd_path is not None
    cache = tmp_path / "cache"
    with tmpfs(tmp_path / "disk", "8m") as disk, _bound(disk, tmp_path / "mnt") as mounted:
        mnt = tmp_path / "mnt"
        pte = tmp_path / "ext.pte"
        pte.write_bytes(EXT.pte_path.read_bytes())
        (disk / "ext.ptd").write_bytes(EXT.ptd_path.read_bytes())
        copy = ptestore.ensure(pte, cache_dir=cache, backends=[FLEET_SPEC], ptd=mnt / "ext.ptd")
        job = _job(tmp_path, 2.0)
        job.write_text(job.read_text().replace(f"{tmp_path}/out/", f"{mnt}/out/"))
        assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
        index = mnt / "out" / "ptestore-index.json"
        fetched = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
        manifest = json.loads(Path(CacheLayout(cache).manifest(fetched.key)).read_text())
        assert manifest["index_device"] == disk.stat().st_dev
        assert prune_stale(cache).entries == []
        mounted(False)
        reasons = {e.key: (e.action, e.reason) for e in prune_stale(cache).entries}
        dev = disk.stat().st_dev
        off = f"is missing and its file system is not mounted (it was on device {dev}"
        assert reasons == {
            copy.key: ("kept: unknown", f"its .ptd {mnt / 'ext.ptd'} {off}; the nearest "
                       f"directory there, {mnt}, is on device {tmp_path.stat().st_dev})"),
            fetched.key: ("kept: unknown", f"its index {index} {off}; the nearest directory "
                          f"there, {mnt}, is on device {tmp_path.stat().st_dev})"),
        }  # fmt: skip
        mounted(True)
        assert prune_stale(cache).entries == []


@pytest.mark.parametrize(
    ("option", "hint"),
    [
        ("endpoint_ulr=http://127.0.0.1:1", "(did you mean 'endpoint_url'?)"),
        ("bogus_option=1", "(accepted: ["),
    ],
)
def test_cli_prune_stale_refuses_an_option_for_none_of_the_indexes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, hint: str
) -> None:
    """An option that applies to none of the indexes the entries name is bad input (exit
    2, the nearest accepted name), before any index is read; with every index local,
    options are left unused (the cache's URLs decide, as for fetch)."""
    cache = tmp_path / "cache"
    assert main(["fleet", "run", str(_job(tmp_path, 2.0)), "--workers", "1", "-q"]) == 0
    index = tmp_path / "out" / "ptestore-index.json"
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    argv = ["cache", "prune", "--stale", "--dry-run", "--cache-dir", str(cache), "-o", option]
    assert main(argv) == 0  # a local index only: left unused
    assert capsys.readouterr().out.splitlines()[-1] == "would remove 0 stale entries; 1 current"
    manifest = CacheLayout(cache).manifest(made.key)
    doc = json.loads(Path(manifest).read_text())
    remote = "s3://bucket/out/ptestore-index.json"
    Path(manifest).write_text(json.dumps({**doc, "index": remote}))
    assert main(argv) == 2
    err = capsys.readouterr().err
    name = option.split("=")[0]
    assert err.startswith(
        f"ptestore cache: error: storage options ['{name}'] apply to none of {remote} {hint}"
    ), err
    with pytest.raises(ConfigurationError, match=rf"^storage options \['{name}'\] apply to"):
        prune_stale(cache, dry_run=True, storage_options=dict([option.split("=")]))
    assert [e.key for e in list_entries(cache)] == [made.key]


def test_cache_lines_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source whose name holds an escape sequence: ``cache ls`` and ``cache prune
    --stale`` print it escaped, as the error line does (they printed it raw: the
    listing of a cache cleared the screen)."""
    cache = tmp_path / "cache"
    source = _model(tmp_path, "s\x1b[2J.pte")
    ptestore.ensure(source, cache_dir=cache, backends=[SPEC])
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    listed = capsys.readouterr().out
    assert f"{tmp_path}/s\\x1b[2J.pte" in listed and "\x1b" not in listed
    source.unlink()
    assert main(["cache", "prune", "--cache-dir", str(cache), "--stale", "--dry-run"]) == 0
    judged = capsys.readouterr().out
    assert "s\\x1b[2J.pte is gone" in judged and "\x1b" not in judged


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_prune_stale_that_cannot_remove_a_lock_file_says_what_it_did() -> None:
    """``prune_stale`` by the cache's owner whose ``locks/`` it cannot write (mode
    0555): the first stale entry goes, its lock file cannot: a StorageError naming the
    lock file, what was removed and what is kept, as ``clear`` and ``prune`` say it (it
    named the lock file alone)."""
    import shutil
    import tempfile

    from support.as_user import NOBODY, as_user, give_tree

    root = Path(tempfile.mkdtemp(prefix="ptestore-stale-"))
    try:
        (root / "warm").mkdir()
        warm, _ = _three(root / "warm")  # what a run imports, imported before the fork
        prune_stale(warm)
        shutil.rmtree(root / "warm")
        give_tree(root, NOBODY)  # the cache made as nobody (a chown would change ctimes)
        made = as_user(NOBODY, lambda: json.dumps({k: a.key for k, a in _three(root)[1].items()}))
        assert made.startswith("ok: "), made
        keys = json.loads(made[len("ok: ") :])
        cache = root / "cache"
        os.chmod(cache / "locks", 0o555)
        first = min(keys["gone"], keys["changed"])
        held = allocated_under(cache / "entries" / first)
        got = as_user(NOBODY, lambda: prune_stale(cache))
        lock = cache / "locks" / f"{first}.lock"
        assert got == (
            f"StorageError: {cache}: cache prune --stale stopped: {lock}: cannot remove the "
            f"cache lock file: Permission denied; it had removed 1 entry ({held} bytes "
            "freed), 2 entries kept"
        )
        assert first not in [e.key for e in list_entries(cache)]
        assert lock.exists()
    finally:
        os.chmod(root / "cache" / "locks", 0o755)
        shutil.rmtree(root)
