"""What stops ``gc`` of a fleet prefix before it removes anything: an index it cannot
read whole (a version 3 index whose shards, or some of them, are missing; a malformed
live entry), an index that does not describe the tree it sits in (moved or copied from
elsewhere), an index path that is not a regular file; and what it collects: the
directory the kernel resolves (``lnk/..``), a network failure on S3 as one line. Each
refusal removes nothing, says which index and why (message pinned), exit 1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore._text import shown
from ptestore.cli import main
from ptestore.errors import StorageError
from ptestore.fleet import orphans
from ptestore.fleet.index import create_index, load_index
from ptestore.fleet.orphans import collect_orphans
from ptestore.testing.moto import MotoS3, moto_s3_server
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
MONTH = 30 * 86400
REST = "cannot read the index"


def _job(path: Path, dest: Path, devices: str = THREE, options: str = "") -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{options}'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n' + devices
    )
    return path


def _run(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    capsys.readouterr()


def _run_then_drop_d2(job: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``job`` run for d0, d1, d2 into ``out``, then for d0 and d1 only, and retired:
    d2's artifact and its scaled .ptd are named by no live entry."""
    _run(job, capsys)
    _run(_job(job, out, TWO), capsys)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()


def _made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: str = "", leaf_bytes: int = 0
) -> Path:
    """A job's destination after a run of d0, d1, d2 (every file 30 days old)."""
    out = tmp_path / "out"
    if leaf_bytes:
        create_index(out / "ptestore-index.json", leaf_bytes=leaf_bytes)
    _run(_job(tmp_path / "job.toml", out, THREE, options), capsys)
    _backdate(out)
    return out


def _backdate(root: Path) -> None:
    then = time.time() - MONTH
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, (then, then))


def _artifacts(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in (".pte", ".ptd")}


def _refused(
    target: Path, capsys: pytest.CaptureFixture[str], grace: str = "1d", artifacts: int = 5
) -> str:
    """gc of ``target`` fails on one index, removes nothing: its action."""
    before = _artifacts(target)
    assert len(before) == artifacts  # d0, d1, d2's .pte; the source's .ptd, d2's scaled one
    assert main(["gc", str(target), "--grace", grace, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [failed] = report["entries"]
    assert failed["kind"] == "index"
    assert _artifacts(target) == before
    action: str = failed["action"]
    return action


def _shards(out: Path) -> Path:
    [shards] = out.glob("ptestore-index.v3-*")
    return shards


# ------------------------------------------------------------ a version 3 index, partly


def test_a_model_whose_top_leaf_is_missing_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its catalog kept, its leaf gone: it read as a model without entries, and gc
    removed every file of the model."""
    out = _made(tmp_path, capsys)
    [model] = (_shards(out) / "m").iterdir()
    catalog = model / "catalog.json"
    live = len(json.loads(catalog.read_text())["classes"])
    (model / "t.json").unlink()
    index = out / "ptestore-index.json"
    assert _refused(out, capsys) == (
        f"failed: {index}: {REST}: {catalog}: index catalog classes (live builds) = {live}: "
        "must be none while the model's leaves hold no live entry (they hold 0 entries, "
        "none live: a leaf is missing, or the catalog is behind its leaves (a run retired "
        "them meanwhile: run gc again). `ptestore fleet check-index` says which; restore "
        "any missing leaf before a --repair, which rebuilds the catalog from the leaves as "
        "they are)"
    )


def test_check_index_repair_does_not_hide_a_lost_top_leaf_from_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The top leaf lost under a catalog listing live builds: ``check-index --repair``
    reports a missing leaf and leaves the catalog as it is (exit 1), so gc still refuses.
    Before, it took "listed without a live entry" for a catalog to rebuild: the rebuilt
    catalog listed nothing, and gc then removed every file of the model."""
    out = _made(tmp_path, capsys)
    [model] = (_shards(out) / "m").iterdir()
    catalog = model / "catalog.json"
    (model / "t.json").unlink()
    kept = catalog.read_bytes()
    index = out / "ptestore-index.json"
    left = "mlp: not repaired: a catalog is rebuilt from its leaves: restore the missing one"
    for repair in ([], ["--repair"]):
        assert main(["fleet", "check-index", str(index), *repair]) == 1
        assert capsys.readouterr().out.splitlines() == [
            f"mlp: missing leaf: {model}/t.json: index shard = 'not found': must be there "
            f"while its model's catalog is ({catalog} is there: a leaf is missing (a writer "
            "writes the leaves before the catalog, and never removes one))",
            *([left] if repair else []),
            f"{index}: 1 models, 1 catalogs wrong" + (", 0 repaired" if repair else ""),
        ]
    assert catalog.read_bytes() == kept
    assert _refused(out, capsys).startswith(
        f"failed: {index}: {REST}: {catalog}: index catalog classes (live builds) = "
    )


@pytest.mark.parametrize("lost", ["the directory", "root.json"])
def test_a_root_whose_shards_are_missing_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lost: str
) -> None:
    out = _made(tmp_path, capsys)
    shards = _shards(out)
    if lost == "root.json":
        (shards / "root.json").unlink()
    else:
        shutil.rmtree(shards)
    index = out / "ptestore-index.json"
    assert _refused(out, capsys) == (
        f"failed: {index}: {REST}: {index}: index layout.shards = '{shards.name}': must be a "
        "directory holding root.json, the copy of this root its writers leave there (there "
        f"is none at {shards}/root.json: its shards were removed or moved, and the entries "
        "they held are unknown. Restore them; an index an earlier ptestore made without the "
        "copy gets it from its next fleet run)"
    )


def _nodes(model: Path) -> dict[str, tuple[str, int]]:
    """``{prefix: (state, entries)}`` of a model's trie nodes."""
    out = {}
    for p in model.glob("t*.json"):
        value = json.loads(p.read_text())
        out[p.stem[1:]] = (value["state"], len(value.get("entries", [])))
    return out


def test_a_leaf_missing_below_a_split_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Leaves of 1 KiB: one entry each, below split nodes. A leaf whose sibling holds
    its only other entry: its split node holds one entry below it. A leaf whose loss
    leaves two below every split: its device, which the catalog lists, is in none."""
    out = _made(tmp_path, capsys, leaf_bytes=1024)
    [model] = (_shards(out) / "m").iterdir()
    nodes = _nodes(model)
    leaves = {p for p, (state, n) in nodes.items() if state == "leaf" and n == 1}
    assert len(leaves) == 3
    index = out / "ptestore-index.json"
    pair = next(p for p in sorted(leaves) if p[:-1] + "10"[int(p[-1])] in leaves)
    kept = (model / f"t{pair}.json").read_bytes()
    (model / f"t{pair}.json").unlink()
    assert _refused(out, capsys) == (
        f"failed: {index}: {REST}: {model}/t{pair[:-1]}.json: index shard state = 'split': "
        "must be a node whose halves hold the entries it split (at least 2) (they hold 1: a "
        f"leaf is missing ({model}/t{pair}.json not found))"
    )
    (model / f"t{pair}.json").write_bytes(kept)

    def held(prefix: str) -> int:
        return sum(n for p, (s, n) in nodes.items() if s == "leaf" and p.startswith(prefix))

    alone = next(p for p in sorted(leaves) if held(p[:-1]) - 1 >= 2)
    [lost] = json.loads((model / f"t{alone}.json").read_text())["entries"]
    (model / f"t{alone}.json").unlink()
    catalog = json.loads((model / "catalog.json").read_text())
    [(i, j)] = [
        (i, j)
        for i, c in enumerate(catalog["classes"])
        for j, d in enumerate(c["devices"])
        if d == lost["device"]
    ]
    assert _refused(out, capsys) == (
        f"failed: {index}: {REST}: {model}/catalog.json: index catalog classes[{i}].devices"
        f"[{j}] = '{lost['device']}': must be a device whose entry is in one of the model's "
        "leaves (none holds it: a leaf is missing (a writer updates the leaves before the "
        "catalog, and never removes an entry))"
    )


TWENTY = "".join(f'[devices.d{i:02d}]\nsoc = "s"\n' for i in range(20))


def _twenty(tmp_path: Path, capsys: pytest.CaptureFixture[str], models: str = "") -> Path:
    """A run of 20 devices of one class (the catalog lists 8 of them) into leaves of
    4 KiB (every file 30 days old)."""
    out = tmp_path / "out"
    create_index(out / "ptestore-index.json", leaf_bytes=4096)
    _run(_job(tmp_path / "job.toml", out, models + TWENTY), capsys)
    _backdate(out)
    return out


def _leaves(model: Path) -> dict[str, list[str]]:
    """``{prefix: devices}`` of a model's leaves that exist."""
    out = {}
    for prefix, (state, _) in _nodes(model).items():
        if state == "leaf":
            value = json.loads((model / f"t{prefix}.json").read_text())
            out[prefix] = [e["device"] for e in value["entries"]]
    return out


def test_a_leaf_missing_beside_a_leaf_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leaf of one device the catalog does not list, beside a leaf of two: every split
    above it still holds 2 entries, and it read as an empty half. A split creates each
    half that gets an entry, so a missing half's sibling got them all (and was split)."""
    out = _twenty(tmp_path, capsys)
    [model] = (_shards(out) / "m").iterdir()
    listed = json.loads((model / "catalog.json").read_text())["classes"][0]["devices"]
    leaves = _leaves(model)
    lost = next(
        p
        for p, devices in sorted(leaves.items())
        if len(devices) == 1
        and devices[0] not in listed
        and len(leaves.get(p[:-1] + "10"[int(p[-1])], [])) >= 2
    )
    sibling = lost[:-1] + "10"[int(lost[-1])]
    [device] = leaves[lost]
    (model / f"t{lost}.json").unlink()
    index = out / "ptestore-index.json"
    assert _refused(out, capsys, artifacts=21) == (
        f"failed: {index}: {REST}: {model}/t{lost[:-1]}.json: index shard state = 'split': "
        "must be a node whose halves both exist, unless one got none of the entries it split "
        f"(the other got them all, and was split in turn) ({model}/t{lost}.json is not found "
        f"and {model}/t{sibling}.json is a leaf: a leaf is missing)"
    )
    assert (out / device / "mlp.pte").exists()


def test_gc_job_stops_at_a_pair_the_index_has_no_entry_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leaf of one device the catalog does not list, beside a split node: its split
    node names it among the halves it made, and gc stops. Below a split marker an
    earlier ptestore wrote (no halves), the index reads as a whole one without that
    device (a split's half that got no entry is never created); so does one without a
    model's whole shard directory. gc removed their files; with the job, every pair it
    names has an entry (live or retired), or gc stops."""
    other = f'[[models]]\nname = "other"\nsource = "{EXT.pte_path}"\n'
    out = _twenty(tmp_path, capsys, other)
    job = tmp_path / "job.toml"
    index = out / "ptestore-index.json"
    [model] = (_shards(out) / "m").glob("mlp~*")
    listed = json.loads((model / "catalog.json").read_text())["classes"][0]["devices"]
    leaves = _leaves(model)
    lost = next(
        p
        for p, devices in sorted(leaves.items())
        if len(devices) == 1
        and devices[0] not in listed
        and p[:-1] + "10"[int(p[-1])] not in leaves
    )
    [device] = leaves[lost]
    before = _artifacts(out)
    (model / f"t{lost}.json").unlink()
    split = model / f"t{lost[:-1]}.json"
    halves = json.loads(split.read_text())["halves"]
    assert main(["gc", str(out), "--grace", "0s", "--dry-run", "--json"]) == 1
    [failed] = json.loads(capsys.readouterr().out)["entries"]
    assert failed["action"] == (
        f"failed: {index}: {REST}: {split}: index shard halves = {halves}: must be halves "
        "that exist (a split creates the halves it names before it commits, and a node is "
        f"never removed) ({model}/t{lost}.json is not found: a leaf is missing)"
    )
    for node in model.glob("t*.json"):  # as an earlier ptestore wrote them
        value = json.loads(node.read_text())
        node.write_text(json.dumps({k: v for k, v in value.items() if k != "halves"}))
    assert main(["gc", str(out), "--grace", "0s", "--dry-run", "--json"]) == 0
    shown = {e["location"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert shown == {str(out / device / "mlp.pte")}  # what gc INDEX_PREFIX cannot tell

    def refused() -> str:
        assert main(["gc", "--job", str(job), "--grace", "0s", "--json"]) == 1
        [failed] = json.loads(capsys.readouterr().out)["entries"]
        assert (failed["location"], failed["kind"]) == (str(index), "index")
        assert _artifacts(out) == before
        action: str = failed["action"]
        return action

    hint = (
        "which has no entry in the index, live or retired: the index is incomplete (its "
        "shards lost the entry) or the job's run never published it, and gc would take that "
        "pair's files for orphans. Run `ptestore fleet run JOB` (or `ptestore fleet "
        "check-index`) first"
    )
    assert refused() == f"failed: {index}: the job names mlp/{device}, {hint}"
    [gone] = (_shards(out) / "m").glob("other~*")
    shutil.rmtree(gone)
    assert refused() == f"failed: {index}: the job names mlp/{device} (and 20 more), {hint}"
    _run(job, capsys)  # the run publishes them again
    # A pair the job names that was never made (no file at its destination: a backend
    # that always fails it, a run not there yet) is no lost entry: gc --job goes on.
    text = job.read_text()
    job.write_text(text + '[devices.never]\nsoc = "s"\n')
    assert not (out / "never").exists()
    assert main(["gc", "--job", str(job), "--grace", "0s", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["entries"]
    assert {e["kind"] for e in removed} == {"hold"}  # what the run held, reused: no more
    assert _artifacts(out) == before


# ------------------------------------------------------------ an entry gc cannot read


def test_a_malformed_live_entry_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry whose files are not named as ``select`` reads them was skipped, and
    its files removed as orphans."""
    out = _made(tmp_path, capsys, options="index_version = 2\n")
    index = out / "ptestore-index.json"
    good = json.loads(index.read_text())
    pte = str(out / "d0" / "mlp.pte")
    edits: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda e: e.update(pte=pte), f"pte = {shown(pte)}: must be an object"),
        (lambda e: e.pop("pte"), "pte = None: must be an object"),
        (lambda e: e["pte"].update(url=5), "pte.url = 5: must be a URL or path"),
        (lambda e: e["pte"].update(url=""), "pte.url = '': must be a URL or path"),
        (lambda e: e.update(ptd=[]), "ptd = []: must be an object"),
        (lambda e: e["source"].pop("url"), "source.url = None: must be a URL or path"),
        (lambda e: e.update(xnnpack="x"), "xnnpack = 'x': must be an object or null"),
        (lambda e: e.update(xnnpack={"url": 1}), "xnnpack.url = 1: must be a URL or path, or null"),
    ]
    for edit, message in edits:
        value = json.loads(json.dumps(good))
        [d0] = [e for e in value["entries"] if e["device"] == "d0"]
        edit(d0)
        index.write_text(json.dumps(value))
        assert _refused(out, capsys) == f"failed: {index}: {REST}: {index}: entry mlp/d0 {message}"
    value = json.loads(json.dumps(good))
    value["entries"].append(7)
    index.write_text(json.dumps(value))
    assert _refused(out, capsys) == (
        f"failed: {index}: {REST}: {index}: index entry = 7: must be an object"
    )
    # A retired entry names nothing: its files go (d0's .pte; its .ptd is d1's too).
    [d0] = [e for e in good["entries"] if e["device"] == "d0"]
    d0["retired"], d0["pte"] = {"reason": "dropped"}, "anything"
    index.write_text(json.dumps(good))
    assert main(["gc", str(out), "--grace", "1d", "--json"]) == 0
    assert [e["location"] for e in json.loads(capsys.readouterr().out)["entries"]] == [pte]


# ------------------------------------------------------------ an index from elsewhere


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_an_index_tree_moved_or_copied_elsewhere_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """Its entries name the files where the run wrote them: none of the files beside it.
    gc compared them by URL and removed every one."""
    out = _made(tmp_path, capsys)
    archive = tmp_path / "archive" / "out"
    archive.parent.mkdir()
    (shutil.move if how == "moved" else shutil.copytree)(out, archive)
    _backdate(archive)
    index = archive / "ptestore-index.json"
    pte = str(out / "d0" / "mlp.pte")
    assert _refused(archive, capsys, grace="7d") == (
        f"failed: {index}: {REST}: {index}: entry mlp/d0 pte.url = {shown(pte)}: must be a "
        f"file under {archive}/ (the index's own directory) (an index naming its artifacts "
        "elsewhere was moved, copied or mounted from another place: it does not describe "
        "the files beside it, and gc would remove every one)"
    )
    if how == "copied":  # the original is whole
        assert main(["gc", str(out), "--grace", "1d", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["entries"] == []


def test_a_device_directory_that_is_a_link_is_under_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``out/d1 -> disk2/d1``: the run wrote d1's files through the link, and its entry
    names ``out/d1/mlp.pte``. gc resolved the link and refused every gc of the tree (the
    entry's .pte "not under" the index's directory); it is, as written, and gc never
    lists below a link. A path whose ``..`` leaves the directory still is not."""
    from ptestore.fleet.orphan_refs import named

    out = tmp_path / "out"
    (tmp_path / "disk2" / "d1").mkdir(parents=True)
    out.mkdir()
    (out / "d1").symlink_to(tmp_path / "disk2" / "d1")
    job = _job(tmp_path / "job.toml", out)
    _run_then_drop_d2(job, out, capsys)
    _backdate(out)
    _backdate(tmp_path / "disk2")
    assert (tmp_path / "disk2" / "d1" / "mlp.pte").exists()
    assert main(["gc", str(out), "--grace", "1d", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    removed = {e["location"] for e in report["entries"] if e["action"] == "removed"}
    assert str(out / "d2" / "mlp.pte") in removed and len(removed) == 2  # its scaled .ptd
    assert (tmp_path / "disk2" / "d1" / "mlp.pte").exists() and (out / "d0" / "mlp.pte").exists()
    assert main(["verify", "--job", str(job)]) == 0
    capsys.readouterr()
    entry = next(
        e for e in load_index(out / "ptestore-index.json")["entries"] if e["device"] == "d0"
    )
    escaped = f"{out}/d1/../d0/mlp.pte"  # the kernel: disk2/d0/mlp.pte, not in out
    entry["pte"]["url"] = escaped
    with pytest.raises(Exception, match="must be a file under") as info:
        named([entry], "idx", f"{out}/")
    assert str(info.value) == (
        f"idx: entry mlp/d0 pte.url = {shown(escaped)}: must be a file under {out}/ (the "
        "index's own directory) (an index naming its artifacts elsewhere was moved, copied "
        "or mounted from another place: it does not describe the files beside it, and gc "
        "would remove every one)"
    )


# ------------------------------------------------------------ where gc looks


def test_a_target_through_a_link_and_dot_dot_is_the_kernels_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lnk/..`` with ``lnk -> out/d0``: the kernel says ``out``, where the staging gc
    looks; orphan collection read ``lnk``'s parent instead (no index there: nothing)."""
    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", out)
    _run_then_drop_d2(job, out, capsys)
    _backdate(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lnk").symlink_to(out / "d0")
    orphaned = {p for p in _artifacts(out) if p.startswith(("d2/", "_shared/"))}
    orphaned -= {p for p in orphaned if p.endswith(_sha_name(EXT.ptd_path))}
    assert len(orphaned) == 2  # d2's .pte and its scaled .ptd
    assert main(["gc", f"{elsewhere}/lnk/..", "--grace", "1d", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {e["location"]: e["action"] for e in report["entries"]} == {
        str(out / p): "removed" for p in orphaned
    }
    assert not any((out / p).exists() for p in orphaned)


def _sha_name(path: Path | None) -> str:
    from support.digests import tree

    assert path is not None
    return tree(path.read_bytes()).partition(":")[2] + ".ptd"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_index_path_that_is_no_regular_file_stops_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A FIFO (or a link to a character device) named ptestore-index.json in a directory
    above the prefix: gc opened and read it, and waited forever. A fresh process, so
    that the test fails (at its ceiling) rather than hangs should it wait again."""
    out = _made(tmp_path, capsys)
    above = tmp_path / "ptestore-index.json"
    if kind == "fifo":
        os.mkfifo(above)
        what = "a FIFO (named pipe)"
    else:
        above.symlink_to("/dev/zero")
        what = "a character device"
    tests = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "ptestore", "gc", str(out), "--grace", "1d", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a generous ceiling, not a measured wait
    )
    assert done.returncode == 1, done.stderr
    [failed] = json.loads(done.stdout)["entries"]
    assert (failed["kind"], failed["location"]) == ("index", str(above))
    assert failed["action"] == (
        f"failed: {above}: {REST}: {above}: is {what}, not a regular file; refusing to read it"
    )
    assert len(_artifacts(out)) == 5


# ------------------------------------------------------------ S3: the network


def _unreachable(opts: dict[str, Any], endpoint: str) -> dict[str, Any]:
    down = dict(opts, endpoint_url=endpoint, retry_attempts=1)
    down["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}}
    return down


@pytest.mark.s3
def test_a_network_failure_on_s3_is_one_storage_error(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing, or the clock read after the indexes (the server stopped between
    them): a StorageError naming the prefix and the request, never botocore's own."""
    import socket

    from ptestore.fleet.index import publish_entries
    from ptestore.testing.fleet_index import synthetic_entry

    bucket = moto_s3.new_bucket()
    root = f"s3://{bucket}/fleet"
    opts = moto_s3.storage_options
    publish_entries(f"{root}/ptestore-index.json", [synthetic_entry("m", "d", root=root)], opts)
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StorageError) as info:
        collect_orphans(root, grace=0, **_unreachable(opts, f"http://127.0.0.1:{port}"))
    assert type(info.value) is StorageError
    assert str(info.value).startswith(
        f"{root}/: ListObjectsV2 failed: Could not connect to the endpoint URL: "
        f'"http://127.0.0.1:{port}/{bucket}?list-type=2&prefix=fleet%2F'
    )
    with ExitStack() as stack:
        server = stack.enter_context(moto_s3_server(min_part_size=None))
        real = orphans._references

        def then_stop(*args: Any) -> Any:
            found = real(*args)
            stack.close()  # the server stops: the clock's listing finds nothing there
            return found

        monkeypatch.setattr(orphans, "_references", then_stop)
        with pytest.raises(StorageError) as info:
            collect_orphans(root, grace=0, **_unreachable(opts, server.endpoint_url))
    assert str(info.value).startswith(
        f"{root}/: ListObjectsV2 failed: Could not connect to the endpoint URL: "
        f'"{server.endpoint_url}/{bucket}?list-type=2&prefix=fleet&max-keys=1'
    )
    assert load_index(f"{root}/ptestore-index.json", **opts)["entries"]  # nothing changed


@pytest.mark.s3
def test_missing_shards_stop_gc_on_s3(s3_server: S3TestServer) -> None:
    """The same reads on S3, where a directory is its objects: a model's leaf deleted
    (its catalog kept), then every object of the shards."""
    from ptestore.fleet.index import publish_entries
    from ptestore.testing.fleet_index import synthetic_entry

    bucket, opts = s3_server.new_bucket(), s3_server.storage_options
    client = s3_server.client()
    root = f"s3://{bucket}/fleet"
    index = f"{root}/ptestore-index.json"
    publish_entries(index, [synthetic_entry("m", d, root=root) for d in ("a", "b")], opts)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    [leaf] = [k for k in keys if k.endswith("/t.json")]
    client.delete_object(Bucket=bucket, Key=leaf)
    [failed] = collect_orphans(root, grace=0, **opts)
    catalog = f"s3://{bucket}/{leaf.removesuffix('t.json')}catalog.json"
    assert (failed.location, failed.kind) == (index, "index")
    assert failed.action.startswith(
        f"failed: {index}: {REST}: {catalog}: index catalog classes (live builds) = "
    )
    for key in keys:
        if key.startswith("fleet/ptestore-index.v3-"):
            client.delete_object(Bucket=bucket, Key=key)
    [failed] = collect_orphans(root, grace=0, **opts)
    assert failed.action.startswith(f"failed: {index}: {REST}: {index}: index layout.shards = ")
    assert "root.json: its shards were removed or moved" in failed.action
