"""``ptestore.ensure(index, model=..., device=...)``: the artifact a real ``fleet run``'s
job index selects, fetched once into the cache, a hit while the index names it, fetched
again when the index names a newer one, never replaced by a download that does not
match; the portable source specialized here when nothing fits."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from support.digests import tree
from support.fixtures import get_fixture
from support.fleetrun import fleet_run
from support.forged import content_of
from support.s3job import s3_options_toml, source_on_s3

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries
from ptestore.errors import ConfigurationError, IntegrityError
from ptestore.provenance import read_trailer
from ptestore.storage.loaders import BytesLoader
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
#: The same backend, upgraded: a newer build of every pair, with the same device options.
NEWER = "support.fleet_backend:Scaler=2.0"
A = DeviceProfile("a", {"soc": "x", "scale": 2.0})


def _job(
    tmp: Path,
    dest: str,
    scale: float = 2.0,
    extra: str = "",
    spec: str = SPEC,
    source: tuple[str, str] = (str(EXT.pte_path), str(EXT.ptd_path)),
) -> Path:
    job = tmp / f"job{len(list(tmp.glob('job*.toml')))}.toml"
    pte, ptd = source
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{spec}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{pte}"\nptd = "{ptd}"\n'
        f'[devices.a]\nsoc = "x"\nscale = {scale}\n[devices.b]\nsoc = "y"\nscale = 3.0\n'
    )
    return job


def _fleet_run_on_s3(server: S3TestServer, tmp: Path, capsys: Any) -> tuple[str, str]:
    """``_job``'s fleet run into a new bucket of ``server``: the bucket and the index."""
    bucket = server.new_bucket()
    extra = s3_options_toml(server.storage_options)
    return bucket, fleet_run(_job(tmp, f"s3://{bucket}/fleet", extra=extra), capsys)


def _tree(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def test_fetched_once_hit_while_current_refetched_when_stale_kept_when_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    pte = out / "a" / "m.pte"
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert first.created and first.choice is not None
    # The fleet stores the .ptd once, under its content address; the index names it.
    chosen = ptestore.select(index, "m", A).ptd
    assert chosen is not None
    ptd = Path(chosen["url"])
    assert ptd.parent == out / "_shared" / "sha256-tree"
    assert (first.choice["kind"], first.choice["made_for"]) == ("artifact", "a")
    assert Path(first.pte).read_bytes() == pte.read_bytes()
    assert first.ptd is not None and Path(first.ptd).read_bytes() == ptd.read_bytes()
    assert first.provenance is not None and first.provenance.device is not None
    assert first.provenance.device.name == "a"
    assert sorted(os.listdir(Path(first.pte).parent)) == ["manifest.json", "model.ptd", "model.pte"]

    # A hit reads the index, not the artifact: with the artifact gone from the fleet's
    # destination it is still answered from the cache.
    pte.rename(tmp_path / "away.pte")
    hit = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not hit.created and (hit.pte, hit.key) == (first.pte, first.key)
    assert hit.choice == first.choice
    (tmp_path / "away.pte").rename(pte)

    # A newer run of the job (other options for 'a'): the index names another artifact,
    # so the entry is stale and fetched again, in its place.
    old_bytes = pte.read_bytes()
    fleet_run(_job(tmp_path, str(out), scale=3.0), capsys)
    assert pte.read_bytes() != old_bytes
    # (The device asks with the profile the job now names: select gives a device only
    # the build made for its own profile, or one its installed backends vouch for.)
    a3 = DeviceProfile("a", {"soc": "x", "scale": 3.0})
    fresh = ptestore.ensure(index, cache_dir=cache, model="m", device=a3)
    assert fresh.created and fresh.key == first.key and fresh.pte == first.pte
    assert Path(fresh.pte).read_bytes() == pte.read_bytes()
    assert [e.key for e in list_entries(cache)] == [first.key]

    # The scale lives in the .ptd: the .pte's content is the one the cache holds, so it
    # is taken from there (verified against the new record), only its trailer and the
    # .ptd are downloaded.
    assert fresh.choice is not None
    content = fresh.provenance.content if fresh.provenance is not None else None
    assert content is not None
    assert fresh.choice["fetched"]["from_base"] == content.size
    assert fresh.choice["fetched"]["bases"] == [first.pte]

    # Another run, then its artifact is damaged, and so is the cache's copy of those
    # bytes (whose own record still names the good ones): the download does not match
    # the index, nothing is published, and the cache is exactly as it was.
    fleet_run(_job(tmp_path, str(out), scale=4.0), capsys)
    a4 = DeviceProfile("a", {"soc": "x", "scale": 4.0})
    data = bytearray(pte.read_bytes())
    data[len(data) // 3] ^= 1
    pte.write_bytes(bytes(data))
    cached = Path(first.pte)
    cached.chmod(0o644)
    cached.write_bytes(bytes(data[: content.size]) + cached.read_bytes()[content.size :])
    cached.chmod(0o444)
    before = _tree(cache)
    states = [e.state for e in list_entries(cache)]
    assert states == ["broken"]  # its file is not as its manifest records any more
    with pytest.raises(IntegrityError) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device=a4)
    assert str(info.value).startswith(f"{pte}: downloaded bytes 0:")
    assert "(chunk 0) have sha256:" in str(info.value)
    assert ", the record in its trailer (the one the index names) says sha256:" in str(info.value)
    # The entry's files and manifest are as they were; the good .ptd, checked before the
    # .pte failed, stays as a download the next attempt resumes (nothing was published).
    after = _tree(cache)
    parts = sorted(k for k in after if k not in before)
    assert [p.rsplit("/", 1)[1] for p in parts] == ["incoming.ptd.part", "incoming.ptd.part.json"]
    assert {k: v for k, v in after.items() if k in before} == before
    assert [e.state for e in list_entries(cache)] == states
    before = after
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "a"]
    assert main([*argv, "--device-option", "soc=x", "--device-option", "scale=4.0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore ensure: failed, nothing published: {pte}: downloaded ")
    assert _tree(cache) == before


def test_nothing_fits_specializes_the_portable_source_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EXT.pte_path is not None
    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    cache = tmp_path / "cache"
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=z, backends=[SPEC])
    assert made.created and made.choice is not None and made.choice["kind"] == "source"
    assert made.choice["reason"].startswith("no artifact of 'm' fits 'z' (a: ")
    assert made.provenance is not None and made.specialized
    want = tree(EXT.pte_path.read_bytes())
    assert made.provenance.source.sha256 == want
    assert made.ptd is not None and made.provenance.device is not None
    assert made.provenance.device.options == {"soc": "q", "scale": 5.0}
    # Storage options given for a local index naming a local source are left unused.
    again = ptestore.ensure(
        index, cache_dir=cache, model="m", device=z, backends=[SPEC], storage_options={"anon": True}
    )
    assert not again.created and again.pte == made.pte and again.choice is not None


def _flags(opts: dict[str, Any]) -> list[str]:
    """``opts`` as the CLI's ``-o KEY=VALUE`` flags."""
    return [
        x
        for k, v in opts.items()
        for x in ("-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]


def _timeless(data: bytes) -> dict[str, Any]:
    """The provenance record of ``data`` without its creation time."""
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    record = dict(trailer.record())
    record.pop("created", None)
    return record


@pytest.mark.s3
def test_nothing_fits_specializes_a_portable_source_on_the_index_s_store(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The portable source and its .ptd on the S3 server the index is on (its endpoint,
    its credentials): the options given for the index reach them, to fingerprint the
    source, to find the hit and to specialize it; ``ptestore ensure -o`` too."""
    bucket, source = source_on_s3(s3_server)
    extra = s3_options_toml(s3_server.storage_options)
    index = fleet_run(_job(tmp_path, f"s3://{bucket}/fleet", extra=extra, source=source), capsys)
    assert index.startswith(f"s3://{bucket}/")
    opts = s3_server.storage_options
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"model": "m", "device": z, "backends": [SPEC]}
    made = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert made.created and made.specialized and made.choice is not None
    assert made.choice["kind"] == "source"
    assert made.provenance is not None and made.provenance.device is not None
    assert made.provenance.device.options == {"soc": "q", "scale": 5.0}
    assert made.provenance.source.url == source[0]
    assert made.provenance.ptd_source is not None
    assert made.provenance.ptd_source.url == source[1]
    assert EXT.pte_path is not None
    assert made.provenance.source.sha256 == tree(EXT.pte_path.read_bytes())
    assert [e.source for e in list_entries(cache)] == [source[0]]
    again = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert not again.created and (again.pte, again.key) == (made.pte, made.key)

    argv = ["ensure", index, "--cache-dir", str(tmp_path / "cli"), "--model", "m"]
    argv += ["--device", "z", "--device-option", "soc=q", "--device-option", "scale=5.0"]
    argv += ["--backend", SPEC, *_flags(opts), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["created"] is True and first["choice"]["kind"] == "source"
    # The same bytes and the same record, but for when each was made (two runs may
    # straddle a second: the record's creation time is not compared).
    cli_made, api_made = Path(first["pte"]).read_bytes(), Path(made.pte).read_bytes()
    assert content_of(cli_made) == content_of(api_made)
    assert _timeless(cli_made) == _timeless(api_made)
    assert main(argv) == 0
    hit = json.loads(capsys.readouterr().out)
    assert hit["created"] is False and hit["pte"] == first["pte"]


@pytest.mark.s3
def test_a_local_index_s_options_reach_the_portable_source_it_names(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local index naming a portable source on S3: the options reach the source; one
    that applies to none of the source's URLs is refused once the index is read, before
    the source is (as for the artifacts it names)."""
    _, source = source_on_s3(s3_server)
    extra = s3_options_toml(s3_server.storage_options)
    index = fleet_run(_job(tmp_path, str(tmp_path / "out"), extra=extra, source=source), capsys)
    opts = s3_server.storage_options
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"model": "m", "device": z, "backends": [SPEC]}
    typo = {**opts, "endpoint_ulr": opts["endpoint_url"]}
    with pytest.raises(ConfigurationError) as info:
        ptestore.ensure(index, cache_dir=cache, storage_options=typo, **kwargs)
    assert str(info.value) == (
        f"{index}: the files it names: storage options ['endpoint_ulr'] apply to none of "
        f"{source[0]}, {source[1]} (did you mean 'endpoint_url'?)"
    )
    assert list_entries(cache) == []
    made = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert made.created and made.choice is not None and made.choice["kind"] == "source"
    again = ptestore.ensure(index, cache_dir=cache, storage_options=opts, **kwargs)
    assert not again.created and again.pte == made.pte


def test_index_arguments_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    cache = tmp_path / "cache"
    cases: list[tuple[str, dict[str, Any], str]] = [
        (index, {}, f"{index}: a job index needs model= (CLI: --model NAME) and device= "
         "(--device NAME)"),
        (str(EXT.pte_path), {"model": "m"}, f"{EXT.pte_path}: model='m' names a model of a "
         "job index (a .json such as ptestore-index.json); this source is not one"),
        (index, {"model": "m"}, f"{index}: ensure from an index needs device= (CLI: --device)"),
        (index, {"model": "m", "device": A, "ptd": "x.ptd"},
         f"{index}: ptd= does not apply to an index (it names the .ptd)"),
        (index, {"model": "m", "device": A, "in_place": True},
         f"{index}: in_place=True does not apply to an index"),
        (index, {"model": "m", "device": A, "provenance": False},
         f"{index}: provenance=False does not apply to an index: its artifacts carry the "
         "trailers the index names (and the download is checked against them)"),
        (index, {"model": "nope", "device": A}, f"{index}: index has no model 'nope' (models: m)"),
        (str(EXT.pte_path), {"storage_options": {"anon": True}},
         f"{EXT.pte_path}: storage_options apply to a job index (with model=), not to a .pte"),
    ]  # fmt: skip
    for source, kwargs, message in cases:
        with pytest.raises(ConfigurationError) as info:
            ptestore.ensure(source, cache_dir=cache, **kwargs)
        assert str(info.value) == message


@pytest.mark.s3
def test_cli_ensure_from_an_index_on_s3(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket, index = _fleet_run_on_s3(s3_server, tmp_path, capsys)
    flags = _flags(s3_server.storage_options)
    argv = ["ensure", index, "--cache-dir", str(tmp_path / "cache"), "--model", "m"]
    argv += ["--device", "a", "--device-option", "soc=x", "--device-option", "scale=2.0"]
    assert main([*argv, *flags, "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["created"] is True and made["choice"]["made_for"] == "a"
    want = s3_server.client().get_object(Bucket=bucket, Key="fleet/a/m.pte")["Body"].read()
    assert Path(made["pte"]).read_bytes() == want
    assert main([*argv, *flags]) == 0
    assert capsys.readouterr().out.splitlines() == [made["pte"], made["ptd"]]
    assert main([*argv, *flags, "--no-provenance"]) == 2
    assert "provenance=False does not apply to an index" in capsys.readouterr().err


def test_a_local_ensure_does_not_import_the_fleet(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, ptestore\n"
        f"ptestore.ensure({str(EXT.pte_path)!r}, cache_dir={str(tmp_path / 'c')!r},"
        f" ptd={str(EXT.ptd_path)!r}, backends=['passthrough'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('ptestore.fleet')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_an_index_hit_reads_the_installed_metadata_through_the_cache_s_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """select asks the backends installed here to rate builds: their entry points and
    versions come from the cache's snapshot, so a hit from a fresh process whose
    installation is unchanged does not import ``importlib.metadata`` (the first run
    fetches before the cache exists; the second records the snapshot)."""
    import subprocess
    import sys

    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "import ptestore\n"
        "from ptestore.backends.compat import DeviceProfile\n"
        f"a = ptestore.ensure({index!r}, cache_dir={str(tmp_path / 'cache')!r}, model='m',"
        " device=DeviceProfile('a', {'soc': 'x', 'scale': 2.0}))\n"
        "print(json.dumps([a.created, 'importlib.metadata' in sys.modules]))\n"
    )

    def run() -> list[bool]:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        return list(json.loads(done.stdout))

    assert run() == [True, True]
    assert run() == [False, True]
    assert run() == [False, False]
    assert (tmp_path / "cache" / "backends.json").is_file()


# --- offline, and the portable source against the index (issue 29 G) ---------------


def test_a_cached_entry_is_served_offline_and_only_for_its_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    # The index is gone (an unmounted share, a removed file): the entry is served.
    away = tmp_path / "away.json"
    os.rename(index, away)
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not served.created and (served.pte, served.ptd) == (first.pte, first.ptd)
    assert served.choice is not None and first.choice is not None
    assert {k: v for k, v in served.choice.items() if k != "offline"} == first.choice
    assert served.choice["offline"] == (
        f"served from the cache offline: {index}: no such file; this is the artifact the "
        "index named when it was fetched, verified then and unchanged since"
    )
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "a"]
    argv += ["--device-option", "soc=x", "--device-option", "scale=2.0"]
    caplog.clear()
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [first.pte, first.ptd]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{index}: {served.choice['offline']}"
    ]
    # Not for another profile of the device, nor once its files changed.
    with pytest.raises(ptestore.errors.ObjectNotFound):
        ptestore.ensure(index, cache_dir=cache, model="m", device=DeviceProfile("a", {"soc": "x"}))
    with open(first.pte, "r+b") as f:
        f.write(b"\0")
    with pytest.raises(ptestore.errors.ObjectNotFound):
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)


def test_a_device_named_alone_gets_what_select_picks_for_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ensure(index, model=..., device="a")`` (CLI ``--device a`` without options)
    takes the options the index records for ``a``, as ``select`` does: the device's own
    build, the same entry as its full profile, served offline by name too. (The CLI
    took a name alone as a profile without options: the portable source, unspecialized.)"""
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    picked = ptestore.select(index, "m", "a")
    assert picked.kind == "artifact" and picked.made_for == "a"
    assert picked.device_options == {"soc": "x", "scale": 2.0}
    named = ptestore.ensure(index, cache_dir=cache, model="m", device="a")
    assert named.created and named.choice is not None
    assert named.choice["kind"] == "artifact" and named.choice["pte"] == picked.pte
    full = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not full.created and (full.key, full.pte) == (named.key, named.pte)
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "a"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["choice"]["kind"] == "artifact" and got["pte"] == named.pte
    os.rename(index, tmp_path / "away.json")  # offline: the entry of that name is served
    served = ptestore.ensure(index, cache_dir=cache, model="m", device="a")
    assert not served.created and served.pte == named.pte
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            "device must be a DeviceProfile or None, got str (a name alone only with an index, "
            "model=)"
        ),
    ):
        ptestore.ensure(EXT.pte_path, cache_dir=cache, device="a")


def test_the_entry_is_served_when_the_newer_artifact_cannot_be_downloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    old = Path(first.pte).read_bytes()
    # A newer artifact for 'a' (a backend upgrade; the device's options are the same, so
    # it is still the device's own build)
    fleet_run(_job(tmp_path, str(out), spec=NEWER), capsys)
    pte = out / "a" / "m.pte"
    pte.rename(tmp_path / "away.pte")  # ... which cannot be downloaded now
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not served.created and Path(served.pte).read_bytes() == old
    assert served.choice is not None
    assert served.choice["offline"].startswith(f"served from the cache offline: {pte}: ")
    (tmp_path / "away.pte").rename(pte)
    fresh = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert fresh.created and Path(fresh.pte).read_bytes() == pte.read_bytes()
    assert fresh.choice is not None and "offline" not in fresh.choice


@pytest.mark.s3
def test_a_cached_entry_is_served_when_the_s3_endpoint_is_unreachable(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    _, index = _fleet_run_on_s3(s3_server, tmp_path, capsys)
    opts = s3_server.storage_options
    cache = tmp_path / "cache"
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A, storage_options=opts)
    assert first.created
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = dict(opts, endpoint_url=f"http://127.0.0.1:{port}", retry_attempts=1)
    down["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}}
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=A, storage_options=down)
    assert not served.created and served.pte == first.pte
    assert served.choice is not None
    assert served.choice["offline"].startswith(f"served from the cache offline: {index}: ")
    assert "Could not connect to the endpoint URL" in served.choice["offline"]


def test_the_portable_source_must_be_the_one_the_index_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    src, ptd = tmp_path / "src.pte", tmp_path / "src.ptd"
    src.write_bytes(EXT.pte_path.read_bytes())
    ptd.write_bytes(EXT.ptd_path.read_bytes())
    job = _job(tmp_path, str(tmp_path / "out"))
    job.write_text(job.read_text().replace(str(EXT.pte_path), str(src)).replace(
        str(EXT.ptd_path), str(ptd)))  # fmt: skip
    index = fleet_run(job, capsys)
    cache = tmp_path / "cache"
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    made = ptestore.ensure(index, cache_dir=cache, model="m", device=z, backends=[SPEC])
    assert made.choice is not None and made.choice["kind"] == "source"
    recorded = tree(ptd.read_bytes())
    # The weights at the source's URL change after the fleet run.
    data = bytearray(ptd.read_bytes())
    data[-100] ^= 0xFF
    ptd.write_bytes(bytes(data))
    now = tree(bytes(data))
    with pytest.raises(IntegrityError) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device=z, backends=[SPEC])
    assert str(info.value) == (
        f"{ptd}: the portable .ptd source has {now}, the index {index} records {recorded} "
        "for model 'm'; it is not used (the index names another version of it: run the "
        "fleet job again, or restore the source)"
    )
    assert info.value.published is False


def test_a_failure_between_the_incoming_ptd_and_pte_leaves_the_entry_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from ptestore.device.indexed import index_key
    from ptestore.errors import StorageError
    from ptestore.fleet import fetch as fetch_module

    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    entry = cache / "entries" / index_key(index, "m", A)
    incoming = entry / "incoming.pte"
    real_rename = fetch_module.rename

    def rename(src: str, dst: str, *args: Any, **kwargs: Any) -> None:
        # The incoming .pte cannot be published: once its .ptd is, its name is taken by
        # a directory (made after fetch checked its destination).
        if dst == str(incoming) and not incoming.exists():
            (incoming / "x").mkdir(parents=True)
        real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(fetch_module, "rename", rename)
    with pytest.raises(StorageError) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    text = str(info.value)
    assert type(info.value) is StorageError
    assert text.startswith(f"{entry}/incoming.pte.part: cannot rename to {entry}/incoming.pte")
    assert text.endswith(
        "; nothing was published in the cache entry (the incoming files were removed)"
    )
    assert not (entry / "incoming.ptd").exists() and not (entry / "manifest.json").exists()
    argv = ["ensure", index, "--cache-dir", str(cache), "--model", "m", "--device", "a"]
    argv += ["--device-option", "soc=x", "--device-option", "scale=2.0"]
    shutil.rmtree(incoming)
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("ptestore ensure: failed, nothing published: ")
    # Once the name is free the entry is made; a later failure of that kind serves it,
    # and so does a directory there before the fetch (refused up front, in the cache).
    monkeypatch.undo()
    shutil.rmtree(incoming)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert first.created
    fleet_run(_job(tmp_path, str(out), spec=NEWER), capsys)
    monkeypatch.setattr(fetch_module, "rename", rename)
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not served.created and served.pte == first.pte and served.choice is not None
    assert "nothing was published in the cache entry" in served.choice["offline"]
    monkeypatch.undo()
    served = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert not served.created and served.pte == first.pte and served.choice is not None
    assert served.choice["offline"].startswith(
        f"served from the cache offline: {incoming}: is a directory; DEST is the path of "
    )
    assert "nothing was published in the cache entry" in served.choice["offline"]


@pytest.mark.parametrize("earlier", [False, True])
def test_a_full_disk_at_the_manifest_of_a_fetched_entry_leaves_no_half_entry(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    earlier: bool,
) -> None:
    """The download is in the entry and its manifest cannot be published (a full disk):
    the fetched files go too, and with them an earlier entry whose files they replaced
    (its manifest named those); the error says which, as for a specialized entry."""
    import errno

    import ptestore.storage.atomic as atomic
    from ptestore.device.indexed import index_key
    from ptestore.errors import StorageError

    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    if earlier:
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)
        fleet_run(_job(tmp_path, str(out), spec=NEWER), capsys)  # a newer artifact
    real = atomic.put_bytes

    def full(path: Any, *args: Any, **kw: Any) -> Any:
        if str(path).endswith("manifest.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(atomic, "put_bytes", full)
    with pytest.raises(StorageError) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    said = (
        "the entry's earlier version, whose files this run had replaced, was removed"
        if earlier
        else "the cache and the source are unchanged"
    )
    assert str(info.value).startswith(f"{cache}: no space left on the file system")
    assert said in str(info.value)
    entry = cache / "entries" / index_key(index, "m", A)
    # The directory the run created went with its files; an earlier entry's, emptied,
    # too (it stayed, an empty "incomplete" entry until prune)
    assert not entry.exists()
    monkeypatch.undo()
    assert ptestore.ensure(index, cache_dir=cache, model="m", device=A).created


def test_an_entry_that_is_a_link_is_not_served_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline, the entry is checked as everywhere else in the cache: a symbolic link at
    the entry (to a copy elsewhere, this user's, its manifest intact) is refused, never
    followed and served."""
    import shutil

    from ptestore.device.indexed import index_key
    from ptestore.errors import PermissionDenied

    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    entry = cache / "entries" / index_key(index, "m", A)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(entry, elsewhere)
    entry.symlink_to(elsewhere)
    os.rename(index, tmp_path / "away.json")  # the index is gone: served offline, or not
    with pytest.raises(PermissionDenied) as info:
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert str(info.value).startswith(
        f"{entry}: the cache entry is a symbolic link, not a directory: "
    )


@pytest.mark.parametrize("pte_record", ["model.pte", ["model.pte"], 7])
def test_a_malformed_manifest_of_another_entry_is_not_a_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pte_record: object
) -> None:
    """Another entry of the model (another index) whose manifest's ``files.pte`` is not
    an object is skipped as a base, as an unreadable manifest is (it raised
    ``AttributeError``); the download takes the store's bytes."""
    cache = tmp_path / "cache"
    one = fleet_run(_job(tmp_path, str(tmp_path / "one")), capsys)
    two = fleet_run(_job(tmp_path, str(tmp_path / "two"), spec=NEWER), capsys)
    first = ptestore.ensure(one, cache_dir=cache, model="m", device=A)
    manifest = Path(first.pte).parent / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["files"]["pte"] = pte_record
    with open(manifest, "r+") as f:  # the same file: its owner and mode kept
        f.write(json.dumps(doc))
        f.truncate()
    other = ptestore.ensure(two, cache_dir=cache, model="m", device=A)
    assert other.created and other.choice is not None
    assert other.choice["fetched"]["bases"] == []
    assert Path(other.pte).read_bytes() == (tmp_path / "two" / "a" / "m.pte").read_bytes()


def test_select_s_reasons_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index whose device names hold an escape sequence (a version 2 index written
    by another tool: a job refuses such names): ``select``'s reason quotes them
    escaped, as the error line would (it printed them raw)."""
    from ptestore.fleet.index import load_index

    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    entries = load_index(index)["entries"]
    for e in entries:
        e["device"] += "\x1b[2J"
    v2 = tmp_path / "v2.json"
    v2.write_text(
        json.dumps({"format": "ptestore.index", "version": 2, "updated": "x", "entries": entries})
    )
    argv = ["select", str(v2), "--model", "m", "--device", "z", "--device-option", "soc=x"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(a\\x1b[2J: XnnpackBackend: " in out and "\x1b" not in out


def test_a_portable_source_the_index_does_not_record_leaves_the_cache_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index records another SHA-256 for the portable source than the one at its
    URL: ``ensure`` refuses it before its entry is published, so nothing is kept and no
    other entry is evicted for it (it published the entry, evicted down to max_bytes,
    then raised: the new entry stayed, the valid one was gone)."""
    from ptestore.fleet.index import load_index

    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    cache = tmp_path / "cache"
    kept = ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    before = _tree(cache / "entries")
    entries = load_index(index)["entries"]
    claimed = "sha256-tree:" + "0" * 64
    for e in entries:
        e["source"]["sha256"] = claimed
    v2 = tmp_path / "v2" / "ptestore-index.json"
    v2.parent.mkdir()
    v2.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    assert EXT.pte_path is not None
    have = tree(EXT.pte_path.read_bytes())
    want = (
        f"{entries[0]['source']['url']}: the portable source has {have}, "
        f"the index {v2} records {claimed} for model 'm'; it is not used (the index names "
        "another version of it: run the fleet job again, or restore the source)"
    )
    for _ in range(2):  # and again: nothing was left to be a hit
        with pytest.raises(IntegrityError) as info:
            ptestore.ensure(
                str(v2), cache_dir=cache, model="m", device=z, backends=[SPEC], max_bytes=1
            )
        assert str(info.value) == want
        assert [e.key for e in list_entries(cache)] == [kept.key]  # none kept, none evicted
        assert _tree(cache / "entries") == before


def test_a_failed_fetch_leaves_no_entry_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fetch that fails before anything was downloaded (the .ptd the index names is
    gone) removes the entry directory it created, which ``cache ls`` listed as an
    incomplete entry; the next fetch makes the entry."""
    from ptestore.errors import ObjectNotFound

    out, cache = tmp_path / "out", tmp_path / "cache"
    index = fleet_run(_job(tmp_path, str(out)), capsys)
    shared = out / "_shared"
    shared.rename(tmp_path / "away")
    with pytest.raises(
        ObjectNotFound, match=rf"^{shared}/sha256-tree/[0-9a-f]+\.ptd: no such file"
    ):
        ptestore.ensure(index, cache_dir=cache, model="m", device=A)
    assert list_entries(cache) == [] and os.listdir(cache / "entries") == []
    (tmp_path / "away").rename(shared)
    assert ptestore.ensure(index, cache_dir=cache, model="m", device=A).created


def test_a_refused_portable_source_that_specializes_nothing_is_not_said_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A portable source the index does not record, whose run specialized nothing: the
    refusal alone is raised; no warning says it is served unchanged from a cache entry
    (one was logged before the refusal, for an entry that was never kept)."""
    from ptestore.fleet.index import load_index

    index = fleet_run(_job(tmp_path, str(tmp_path / "out")), capsys)
    entries = load_index(index)["entries"]
    for e in entries:
        e["source"]["sha256"] = "sha256-tree:" + "0" * 64
    v2 = tmp_path / "v2" / "ptestore-index.json"
    v2.parent.mkdir()
    v2.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    z = DeviceProfile("z", {"soc": "q", "scale": 5.0})
    quiet = "support.quiet_backend:Quiet"  # declines: the run specializes nothing
    caplog.set_level("WARNING", logger="ptestore.device")
    with pytest.raises(IntegrityError, match=r"the index .* records sha256-tree:0+ for model"):
        ptestore.ensure(str(v2), cache_dir=tmp_path / "c", model="m", device=z, backends=[quiet])
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.device"] == []
    assert list_entries(tmp_path / "c") == []
