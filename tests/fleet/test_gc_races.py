"""gc of a fleet prefix against what changes while it works: an object a run stores
after gc listed it (a retired pair made again, before the run publishes its index) is
never removed, locally (a real ``fleet run``) and on moto and SeaweedFS (an object of
other bytes stored before gc's last look, or between that look and the delete: the
conditional delete); an index gone between gc's two reads governs nothing."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.s3job import s3_options_toml

from ptestore.cli import main
from ptestore.fleet import index as fleet_index
from ptestore.fleet import orphans
from ptestore.fleet.index import find_entry
from ptestore.fleet.orphans import collect_orphans
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
WEEK = 7 * 86400
CHANGED = "skipped: changed since listed"


def _job(path: Path, dest: str, devices: str, options: str = "") -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{options}'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return path


def _run(job: Path) -> None:
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0


def _retired_d2(tmp_path: Path, dest: str, options: str = "") -> Path:
    """A job run with d0, d1, d2, then without d2, and d2 retired: its files orphans."""
    job = _job(tmp_path / "job.toml", dest, THREE, options)
    _run(job)
    _job(job, dest, TWO, options)
    _run(job)
    assert main(["fleet", "retire", str(job)]) == 0
    return job


def _backdate(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _actions(entries: list[Any], root: str) -> dict[str, str]:
    return {e.location[len(root) :]: e.action for e in entries}


def test_an_artifact_a_run_rewrites_while_gc_works_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retired pair, its files a week old, named again by the job: a ``fleet run``
    stores a new d2/mlp.pte after gc listed the old one and publishes its index only
    after gc is done. gc used to remove the new file (reported ``removed``, age 7d)."""
    out = tmp_path / "out"
    job = _retired_d2(tmp_path, str(out))
    d2 = out / "d2" / "mlp.pte"
    for p in [d2, *(out / "_shared" / "sha256-tree").iterdir()]:
        _backdate(p, WEEK + 60)
    listed_ino = d2.stat().st_ino
    _job(job, str(out), THREE.replace("scale = 2.0", "scale = 3.0"))
    stored, gc_done = threading.Event(), threading.Event()
    real_publish = fleet_index.publish_pairs

    def publish_after_gc(*args: Any) -> Any:
        stored.set()  # every artifact of the run is in place: only its index is left
        assert gc_done.wait(120)
        return real_publish(*args)

    monkeypatch.setattr(fleet_index, "publish_pairs", publish_after_gc)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            _run(job)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)
            stored.set()

    runner = threading.Thread(target=run)
    real_now = orphans.OrphanStore.now

    def run_once_listed(self: Any, root: str) -> float:  # gc has listed the files
        runner.start()
        assert stored.wait(120)
        return real_now(self, root)

    monkeypatch.setattr(orphans.OrphanStore, "now", run_once_listed)
    try:
        entries = collect_orphans(out)
    finally:
        gc_done.set()
        runner.join(120)
    assert failures == []
    assert d2.stat().st_ino != listed_ino  # the run's file, not the one gc listed
    acts = _actions(entries, str(out))
    assert acts["/d2/mlp.pte"] == CHANGED
    [age] = [e.age for e in entries if e.location == str(d2)]
    assert age >= WEEK  # the listed file's age: reported as it was judged
    entry = find_entry(str(out / "ptestore-index.json"), "mlp", "d2")
    assert entry is not None and not entry.get("retired")
    capsys.readouterr()
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()


def test_a_file_replaced_after_the_listing_is_kept_and_an_unchanged_one_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same without a run: two week-old orphans; after the listing one is replaced
    by a file backdated as old (only its inode differs): kept; the other removed."""
    out = tmp_path / "out"
    _retired_d2(tmp_path, str(out))
    d2 = out / "d2" / "mlp.pte"
    for p in (out / "_shared" / "sha256-tree").iterdir():
        _backdate(p, WEEK + 60)
    _backdate(d2, WEEK + 60)
    real_now = orphans.OrphanStore.now

    def replace_d2(self: Any, root: str) -> float:
        st = d2.stat()
        staged = d2.with_name(".mlp.pte.new")
        staged.write_bytes(d2.read_bytes())
        os.utime(staged, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same size and time
        staged.rename(d2)
        return real_now(self, root)

    monkeypatch.setattr(orphans.OrphanStore, "now", replace_d2)
    entries = collect_orphans(out, grace=3600)
    acts = _actions(entries, str(out))
    assert acts.pop("/d2/mlp.pte") == CHANGED
    assert set(acts.values()) == {"removed"} and len(acts) == 1  # the scaled shared .ptd
    assert d2.exists()


def test_an_object_and_its_old_hold_both_go_whatever_the_listing_order(
    tmp_path: Path,
) -> None:
    """Orphans with holds older than the grace: gc removed a hold listed before its
    object first, then kept the object "held since listed" (its hold no longer the one
    listed), while --dry-run said both would go. 16 of them, in the directory's order:
    some hold comes before its object (the precondition is checked)."""
    out = tmp_path / "out"
    _retired_d2(tmp_path, str(out))
    names = [f"m{i}.xnnpack-{i:032x}.xpwc" for i in range(16)]
    for name in names:
        (out / name).write_bytes(b"orphan")
        (out / f"{name}.ptestore-hold").write_bytes(b"{}")
    listed = os.listdir(out)
    assert any(listed.index(f"{n}.ptestore-hold") < listed.index(n) for n in names)
    for p in out.rglob("*"):
        if p.is_file():
            _backdate(p, 2 * WEEK)
    dry = collect_orphans(out, grace=WEEK, dry_run=True)
    mine = {str(out / n) for n in names} | {str(out / f"{n}.ptestore-hold") for n in names}
    assert {e.location: e.action for e in dry if e.location in mine} == dict.fromkeys(
        mine, "would remove"
    )
    done = collect_orphans(out, grace=WEEK)
    assert {e.location: e.action for e in done if e.location in mine} == dict.fromkeys(
        mine, "removed"
    )
    assert not any((out / n).exists() for n in names)


def test_an_index_gone_between_the_two_reads_governs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is moved away after gc's first read: the orphans it governed are kept
    (``skipped: no index governs it now``), as if it had been gone from the start."""
    out = tmp_path / "out"
    _retired_d2(tmp_path, str(out))
    index = out / "ptestore-index.json"
    for p in [out / "d2" / "mlp.pte", *(out / "_shared" / "sha256-tree").iterdir()]:
        _backdate(p, WEEK + 60)
    real_now = orphans.OrphanStore.now
    moved = tmp_path / "moved.json"

    def move_index(self: Any, root: str) -> float:
        index.rename(moved)
        return real_now(self, root)

    monkeypatch.setattr(orphans.OrphanStore, "now", move_index)
    entries = collect_orphans(out)
    acts = _actions(entries, str(out))
    assert acts["/d2/mlp.pte"] == "skipped: no index governs it now"
    assert set(acts.values()) == {"skipped: no index governs it now"}, acts
    assert (out / "d2" / "mlp.pte").exists()


@pytest.mark.s3
def test_on_s3_an_object_stored_after_the_listing_is_kept(
    s3_server: S3TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On moto and SeaweedFS: d2/mlp.pte replaced by other bytes (d0's artifact) after
    gc listed it is kept (the ``HEAD`` before the delete), and so is one replaced
    between that ``HEAD`` and the delete (``If-Match`` on the listed ETag: 412); the
    scaled shared .ptd nobody touched goes."""
    bucket, client = s3_server.new_bucket(), s3_server.client()
    opts = s3_server.storage_options
    dest = f"s3://{bucket}/out"
    _retired_d2(tmp_path, dest, s3_options_toml(opts))
    other = client.get_object(Bucket=bucket, Key="out/d0/mlp.pte")["Body"].read()
    head_before = client.head_object(Bucket=bucket, Key="out/d2/mlp.pte")
    real_now = orphans.OrphanStore.now

    def replace_d2(self: Any, root: str) -> float:
        client.put_object(Bucket=bucket, Key="out/d2/mlp.pte", Body=other)
        return real_now(self, root)

    with monkeypatch.context() as m:
        m.setattr(orphans.OrphanStore, "now", replace_d2)
        entries = collect_orphans(dest, grace=0, **opts)
    acts = _actions(entries, f"{dest}/")
    assert acts.pop("d2/mlp.pte") == CHANGED
    assert list(acts.values()) == ["removed"]  # the scaled shared .ptd
    head = client.head_object(Bucket=bucket, Key="out/d2/mlp.pte")
    assert head["ETag"] != head_before["ETag"]

    # The object changes after gc's last look (the HEAD matched): the delete is refused.
    client.put_object(Bucket=bucket, Key="out/d1/extra/mlp.pte", Body=other)  # an orphan
    real_stamp = orphans.OrphanStore.stamp
    mine = f"s3://{bucket}/out/d1/extra/mlp.pte"

    def replace_after_look(self: Any, url: str) -> Any:
        found = real_stamp(self, url)
        if url == mine:
            client.put_object(Bucket=bucket, Key="out/d1/extra/mlp.pte", Body=other + b"\0")
        return found

    monkeypatch.setattr(orphans.OrphanStore, "stamp", replace_after_look)
    entries = collect_orphans(dest, grace=0, **opts)
    # (d2/mlp.pte, d0's bytes now and unchanged since this listing, is an orphan still)
    assert _actions(entries, f"{dest}/") == {"d1/extra/mlp.pte": CHANGED, "d2/mlp.pte": "removed"}
    body = client.get_object(Bucket=bucket, Key="out/d1/extra/mlp.pte")["Body"].read()
    assert body == other + b"\0"
