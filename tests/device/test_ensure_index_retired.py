"""``ensure(index, ...)`` once the index stopped selecting the artifact a device's entry
holds (its build dropped from the job and retired, nothing else fits): offline, the
index's last answer is served (the portable source), never that entry; and
``cache prune --stale``'s options reach a portable source an index named (on S3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.fleetrun import fleet_run
from support.s3job import s3_options_toml, source_on_s3

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries, prune_stale
from ptestore.device.indexed import index_key
from ptestore.device.layout import CacheLayout, read_manifest
from ptestore.errors import ModelRetired, ObjectNotFound, StorageError
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
#: The same backend, upgraded: a newer build of every pair.
NEWER = "support.fleet_backend:Scaler=2.0"
B = DeviceProfile("b", {"soc": "y", "scale": 3.0})
DEVICES = {"a": 'soc = "x"\nscale = 2.0\n', "b": 'soc = "y"\nscale = 3.0\n'}


def _job(tmp: Path, dest: str, source: tuple[str, str], devices: str, extra: str = "") -> Path:
    """A job of model ``m`` (``source``: its .pte and .ptd) for ``devices`` ("ab": a
    and b); rewritten in place, so that a retire judges the same job file."""
    pte, ptd = source
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{pte}"\nptd = "{ptd}"\n'
        + "".join(f"[devices.{d}]\n{DEVICES[d]}" for d in devices)
    )
    return job


def _local_source(tmp: Path) -> tuple[str, str]:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    (tmp / "src").mkdir()
    pte, ptd = tmp / "src" / "m.pte", tmp / "src" / "m.ptd"
    shutil.copyfile(EXT.pte_path, pte)
    shutil.copyfile(EXT.ptd_path, ptd)
    return str(pte), str(ptd)


def _manifest(cache: Path, key: str) -> dict[str, Any]:
    m = read_manifest(CacheLayout(cache).manifest(key))
    assert m is not None
    return m


def _ensure_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_offline_the_last_answer_is_served_never_the_retired_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The review's sequence on a local index: b's own build fetched; b dropped from the
    job and retired; online the portable source; offline (the index moved away) that
    source again, not the retired artifact (it was served, `made_for` b). Once b is in
    the job again, its artifact is fetched again (from the entry's own files) and
    served offline again."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    source = _local_source(tmp_path)
    index = fleet_run(_job(tmp_path, str(out), source, "ab"), capsys)
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "b"]
    argv += ["--backend", SPEC]
    fetched = _ensure_json(argv, capsys)
    assert (fetched["choice"]["kind"], fetched["choice"]["made_for"]) == ("artifact", "b")
    key = index_key(index, "m", "b")
    assert fetched["key"] == key

    fetched_use = os.stat(CacheLayout(cache).manifest(key)).st_mtime
    job = _job(tmp_path, str(out), source, "a")
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    online = _ensure_json(argv, capsys)
    assert online["choice"]["kind"] == "source" and online["created"] is True
    assert online["key"] != key and "offline" not in online["choice"]
    # The entry of b's build records the answer; its files stay as they were.
    # (b by name: the index records no options for b any more.)
    record = _manifest(cache, key)["superseded"]
    assert record["device"] == ["b", DeviceProfile("b", {}).digest()]
    assert record["device_options"] == {}
    assert record["choice"]["kind"] == "source"
    assert record["choice"]["pte"]["url"] == source[0]
    assert Path(fetched["pte"]).is_file() and Path(fetched["ptd"]).is_file()
    # (recording it is no use of the entry: its last use, for eviction, as it was)
    [entry] = [e for e in list_entries(cache) if e.key == key]
    assert entry.last_used == fetched_use
    marked = os.stat(CacheLayout(cache).manifest(key))
    again = _ensure_json(argv, capsys)  # the same answer: nothing written again
    assert (again["created"], again["pte"]) == (False, online["pte"])
    assert os.stat(CacheLayout(cache).manifest(key)).st_ino == marked.st_ino

    os.rename(index, tmp_path / "away.json")
    caplog.clear()
    offline = _ensure_json(argv, capsys)
    assert offline["choice"]["kind"] == "source" and offline["choice"]["made_for"] is None
    assert (offline["pte"], offline["key"], offline["created"]) == (
        online["pte"],
        online["key"],
        False,
    )
    reason = (
        f"served offline: {index}: no such file; the index's last answer for 'b' was the "
        "model's portable source, not the artifact fetched before: the source is served, "
        "as then"
    )
    assert offline["choice"]["offline"] == reason
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{index}: {reason}"
    ]
    # The same by name in Python. b's full profile, the one the entry was fetched for:
    # the answer recorded was given for another profile (b by name, without options),
    # and the entry the index stopped naming for b is not served to any.
    served = ptestore.ensure(index, cache_dir=cache, model="m", device="b", backends=[SPEC])
    assert served.pte == online["pte"] and served.choice is not None
    assert served.choice["offline"] == reason
    with pytest.raises(ObjectNotFound, match=f"^{index}: no such file$"):
        ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    # Online with that profile: the portable source for it, recorded, and served offline.
    os.rename(tmp_path / "away.json", index)
    full = ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    assert full.choice is not None and full.choice["kind"] == "source"
    assert _manifest(cache, key)["superseded"]["device"] == [B.name, B.digest()]
    os.rename(index, tmp_path / "away.json")
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    assert (served.pte, served.key) == (full.pte, full.key) and served.choice is not None
    assert served.choice["offline"] == reason

    # The source gone too: nothing is served, the index's error is raised, the source's
    # logged.
    os.rename(source[0], tmp_path / "away.pte")
    caplog.clear()
    with pytest.raises(ObjectNotFound, match=f"^{index}: no such file$"):
        ptestore.ensure(index, cache_dir=cache, model="m", device="b", backends=[SPEC])
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{index}: cannot be read, and the portable source its last answer named cannot "
        f"either: {source[0]}: no such file"
    ]
    os.rename(tmp_path / "away.pte", source[0])

    # b in the job again: its build is selected, fetched again into the entry (the
    # chunks from the files it holds) and served offline again.
    os.rename(tmp_path / "away.json", index)
    fleet_run(_job(tmp_path, str(out), source, "ab"), capsys)
    back = _ensure_json(argv, capsys)
    assert (back["key"], back["created"], back["choice"]["made_for"]) == (key, True, "b")
    assert back["choice"]["fetched"]["from_base"] > 0  # (the re-run's trailer is new)
    assert back["choice"]["fetched"]["bases"] == sorted([fetched["pte"], fetched["ptd"]])
    assert "superseded" not in _manifest(cache, key)
    os.rename(index, tmp_path / "away.json")
    served = _ensure_json(argv, capsys)
    assert (served["key"], served["pte"]) == (key, back["pte"])
    assert served["choice"]["offline"].startswith("served from the cache offline: ")


def test_a_model_retired_whole_is_never_served_offline(tmp_path: Path) -> None:
    """The model dropped from the job and retired: online ``ModelRetired`` (select picks
    nothing, not even the source), recorded in the entry fetched before for every
    profile of the device; offline that entry is not served (the index's error)."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    pte, ptd = _local_source(tmp_path)
    job = _job(tmp_path, str(out), (pte, ptd), "ab")
    text = job.read_text()
    other = f'[[models]]\nname = "n"\nsource = "{pte}"\nptd = "{ptd}"\n'
    job.write_text(text.replace("[devices.a]", other + "[devices.a]"))
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    index = str(out / "ptestore-index.json")
    fetched = ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    assert fetched.choice is not None and fetched.choice["kind"] == "artifact"
    key = index_key(index, "m", "b")
    job.write_text(text.replace('name = "m"', 'name = "n"'))  # m dropped, n kept
    assert main(["fleet", "retire", str(job)]) == 0
    retired = f"^{index}: index has no model 'm' \\(its entries are retired: "
    with pytest.raises(ModelRetired, match=retired):
        ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    record = _manifest(cache, key)["superseded"]
    assert record == {
        "device": ["b", None],
        "device_options": {},
        "choice": {"model": "m", "kind": "retired"},
    }
    assert Path(fetched.pte).is_file()  # its files left as they were
    os.rename(index, tmp_path / "away.json")
    for device in (B, "b", DeviceProfile("b", {"soc": "z"})):
        with pytest.raises(ObjectNotFound, match=f"^{index}: no such file$"):
            ptestore.ensure(index, cache_dir=cache, model="m", device=device, backends=[SPEC])


def test_an_index_that_stops_fitting_while_the_artifact_is_fetched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer artifact of b selected, then b retired before its download reads the
    index again: the fetch finds that nothing fits; the entry held (b's older build)
    records that answer and is not served: the portable source is."""
    import ptestore.fleet.fetch as fetch_module

    out, cache = tmp_path / "out", tmp_path / "cache"
    source = _local_source(tmp_path)
    index = fleet_run(_job(tmp_path, str(out), source, "ab"), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=B)
    assert first.choice is not None and first.choice["made_for"] == "b"
    newer = _job(tmp_path, str(out), source, "ab").read_text().replace(SPEC, NEWER)
    (tmp_path / "job.toml").write_text(newer)
    fleet_run(tmp_path / "job.toml", capsys)
    real = fetch_module.fetch

    def retired_first(*args: Any, **kwargs: Any) -> Any:
        (tmp_path / "job.toml").write_text(newer.replace(f"[devices.b]\n{DEVICES['b']}", ""))
        assert main(["fleet", "retire", str(tmp_path / "job.toml")]) == 0
        return real(*args, **kwargs)

    monkeypatch.setattr(fetch_module, "fetch", retired_first)
    got = ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    assert got.choice is not None and got.choice["kind"] == "source"
    assert got.choice["offline"].startswith(
        f"served offline: {index}: the index changed while 'm' was fetched for 'b' (no "
        "artifact fits any more); run again; the index's last answer for 'b' was the "
    )
    assert _manifest(cache, first.key)["superseded"]["choice"]["kind"] == "source"
    monkeypatch.setattr(fetch_module, "fetch", real)
    online = ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    assert online.choice is not None and "offline" not in online.choice
    assert (online.pte, online.created) == (got.pte, False)


def test_the_answer_waits_for_a_process_using_the_entry_and_leaves_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process serving b's entry holds its key's lock (shared): the call that
    records the index's new answer waits for it (a ``lock_timeout`` it exceeds: a
    ``LockTimeout``, nothing recorded), then records it without touching the entry's
    files (the paths the other process was handed stay valid)."""
    import threading

    from support.locks import blocked_on, wait_until

    from ptestore.errors import LockTimeout

    out, cache = tmp_path / "out", tmp_path / "cache"
    source = _local_source(tmp_path)
    index = fleet_run(_job(tmp_path, str(out), source, "ab"), capsys)
    held = ptestore.ensure(index, cache_dir=cache, model="m", device=B)
    assert held.ptd is not None
    files = {p: os.stat(p).st_ino for p in (held.pte, held.ptd)}
    assert main(["fleet", "retire", str(_job(tmp_path, str(out), source, "a"))]) == 0
    layout = CacheLayout(cache)
    kwargs: dict[str, Any] = {"model": "m", "device": B, "backends": [SPEC]}
    got: list[Any] = []
    with layout.lock(held.key, shared=True):  # what a hit holds while it reads
        with pytest.raises(LockTimeout, match=f"^{layout.locks}/{held.key}.lock: the cache "):
            ptestore.ensure(index, cache_dir=cache, lock_timeout=0, **kwargs)
        assert "superseded" not in _manifest(cache, held.key)
        waiter = threading.Thread(
            target=lambda: got.append(ptestore.ensure(index, cache_dir=cache, **kwargs))
        )
        waiter.start()
        wait_until(lambda: blocked_on(Path(layout.locks) / f"{held.key}.lock"), "the waiter")
        assert not got
    waiter.join()
    [answer] = got
    assert answer.choice is not None and answer.choice["kind"] == "source"
    assert _manifest(cache, held.key)["superseded"]["device"] == [B.name, B.digest()]
    assert {p: os.stat(p).st_ino for p in files} == files


def test_a_damaged_record_serves_nothing_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record that is not of the form it is written in (edited by hand, damaged): the
    entry is still not served offline, nor anything else: the index's error."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    source = _local_source(tmp_path)
    index = fleet_run(_job(tmp_path, str(out), source, "ab"), capsys)
    held = ptestore.ensure(index, cache_dir=cache, model="m", device=B)
    assert main(["fleet", "retire", str(_job(tmp_path, str(out), source, "a"))]) == 0
    ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])
    path = Path(CacheLayout(cache).manifest(held.key))
    doc = json.loads(path.read_text())
    doc["superseded"]["choice"]["pte"] = "not an object"
    path.write_text(json.dumps(doc))
    os.rename(index, tmp_path / "away.json")
    with pytest.raises(ObjectNotFound, match=f"^{index}: no such file$"):
        ptestore.ensure(index, cache_dir=cache, model="m", device=B, backends=[SPEC])


@pytest.mark.s3
def test_on_s3_the_retired_artifact_is_not_served_and_prune_reaches_the_source(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sequence on an S3 index naming a portable source on its store: offline (the
    index deleted) the source is served, not b's retired artifact; the store down,
    nothing is. ``cache prune --stale -o`` reaches that source as ``ensure`` did (it
    was `kept: unknown` on every prune, read without the options), and finds it
    changed once it is."""
    bucket, source = source_on_s3(s3_server)
    opts = s3_server.storage_options
    extra = s3_options_toml(opts)
    index = fleet_run(_job(tmp_path, f"s3://{bucket}/fleet", source, "ab", extra), capsys)
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"model": "m", "device": B, "backends": [SPEC]}
    fetched = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert fetched.choice is not None and fetched.choice["made_for"] == "b"
    job = _job(tmp_path, f"s3://{bucket}/fleet", source, "a", extra)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    online = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert online.choice is not None and online.choice["kind"] == "source"
    assert _manifest(cache, online.key)["named_by"] == index

    # prune --stale: without the options the source cannot be judged; with them (the
    # API and -o) it is current, and b's retired artifact is stale.
    unknown = {e.key: e.action for e in prune_stale(cache, dry_run=True).entries}
    assert unknown[online.key] == "kept: unknown"
    dry = prune_stale(cache, dry_run=True, storage_options=opts)
    assert [(e.key, e.action) for e in dry.entries] == [(fetched.key, "would remove")]
    assert dry.current == 1
    flags = [
        x
        for k, v in opts.items()
        for x in ("-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]
    argv = ["cache", "prune", "--stale", "--dry-run", "--cache-dir", str(cache), *flags]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "would remove 1 stale entries; 1 current"

    # Offline: the index deleted; the source is served from its entry.
    client = s3_server.client()
    key = index.removeprefix(f"s3://{bucket}/")
    index_bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=bucket, Key=key)
    served = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert (served.pte, served.created) == (online.pte, False)
    assert served.choice is not None and served.choice["kind"] == "source"
    assert served.choice["offline"].startswith(f"served offline: {index}: ")
    # The store unreachable: neither is served (the source cannot be checked either).
    import socket

    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = dict(opts, endpoint_url=f"http://127.0.0.1:{port}", retry_attempts=1)
    down["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}}
    with pytest.raises(StorageError, match="Could not connect to the endpoint URL"):
        ptestore.ensure(index, cache_dir=cache, storage_options=down, **kwargs)
    client.put_object(Bucket=bucket, Key=key, Body=index_bytes)

    # The source replaced on the store: its entry is stale, and removed.
    assert EXT.pte_path is not None
    client.put_object(Bucket=bucket, Key="src/m.pte", Body=EXT.pte_path.read_bytes() + b"\0")
    done = prune_stale(cache, storage_options=opts)
    reasons = {e.key: (e.action, e.reason) for e in done.entries}
    assert reasons[online.key][0] == "removed"
    assert reasons[online.key][1].startswith(f"its source {source[0]} changed (")
    assert [e.key for e in list_entries(cache)] == []


@pytest.mark.s3
def test_prune_options_reach_the_s3_source_a_local_index_named(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local index naming a portable source on S3: every index is local, yet the
    options reach that source (they were left unused, and the source read without
    them: `kept: unknown`); a misspelt one is refused naming the source's URLs, before
    any is read. A copy of a source no index named is read without them."""
    from ptestore.errors import ConfigurationError

    bucket, source = source_on_s3(s3_server)
    opts = s3_server.storage_options
    index = fleet_run(
        _job(tmp_path, str(tmp_path / "out"), source, "a", s3_options_toml(opts)), capsys
    )
    cache = tmp_path / "cache"
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    made = ptestore.ensure(
        index, cache_dir=cache, model="m", device=z, backends=[SPEC], storage_options=opts
    )
    assert made.choice is not None and made.choice["kind"] == "source"
    assert _manifest(cache, made.key)["named_by"] == index
    plain = ptestore.ensure(_local_source(tmp_path)[0], cache_dir=cache, backends=[SPEC])
    assert "named_by" not in _manifest(cache, plain.key)
    assert prune_stale(cache, storage_options=opts).current == 2
    typo = {**opts, "endpoint_ulr": opts["endpoint_url"]}
    with pytest.raises(ConfigurationError) as info:
        prune_stale(cache, storage_options=typo)
    assert str(info.value) == (
        f"storage options ['endpoint_ulr'] apply to none of {source[0]}, {source[1]} "
        "(did you mean 'endpoint_url'?)"
    )
    s3_server.client().delete_object(Bucket=bucket, Key="src/m.ptd")
    [gone] = prune_stale(cache, storage_options=opts).entries
    assert (gone.key, gone.action) == (made.key, "removed")
    assert gone.reason == f"its .ptd {source[1]} is gone"
    assert [e.key for e in list_entries(cache)] == [plain.key]
