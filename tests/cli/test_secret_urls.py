"""A source read through a URL that carries credentials (a user and password, an S3
SigV4 presigned query), from a real HTTP store on 127.0.0.1 that refuses any request
without them (``support/presigned.py``): no secret reaches what ptestore writes or
prints. The provenance trailer of the output (shipped to every device), ``inspect``,
the ``specialize`` summary and ``--json``, error lines and ``--json`` errors, the device
cache (one entry across rotated signatures; manifests and ``cache ls``), a fleet job's
output and index leaves, ``verify``; a trailer an earlier ptestore wrote with the URL
whole still reads, shown redacted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.presigned import SECRETS, SIGNATURES, PresignedStore, presigned_store

from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.provenance import read_trailer, replace_trailer
from ptestore.storage.loaders import BytesLoader
from ptestore.storage.types import redacted_url

MLP = get_fixture("mlp_portable")
assert MLP.pte_path is not None
DATA = MLP.pte_path.read_bytes()


@pytest.fixture
def store() -> Iterator[PresignedStore]:
    with presigned_store({"/models/mlp.pte": DATA}) as s:
        yield s


def _secrets_in(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    return [s for s in SECRETS if s in text]


def _record(path: Path) -> dict:
    trailer = read_trailer(BytesLoader(path.read_bytes()))
    assert trailer is not None
    return trailer.record()


def test_specialize_records_and_prints_the_url_without_its_credentials(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store.url("/models/mlp.pte")
    shown = redacted_url(url)
    out = tmp_path / "a.pte"
    assert main(["specialize", url, str(out), "--backend", "passthrough"]) == 0
    said = capsys.readouterr()
    assert f"pte: {shown} -> {out}" in said.out
    assert _secrets_in(said.out + said.err) == []
    # the trailer: every byte of the file, as shipped
    assert _secrets_in(out.read_bytes()) == []
    assert _record(out)["source"]["url"] == shown
    assert "versionId=v7" in shown and "X-Amz-Signature=REDACTED" in shown
    # every request carried the store's credentials: they were used, never recorded
    assert store.seen and all(a is not None for _, a in store.seen)
    argv = ["specialize", url, str(tmp_path / "b.pte"), "--backend", "passthrough", "--json"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert _secrets_in(text) == [] and json.loads(text)["files"][0]["source"] == shown
    for argv in (["inspect", str(out)], ["inspect", "--json", str(out)], ["inspect", url]):
        assert main(argv) == 0
        said = capsys.readouterr()
        assert _secrets_in(said.out + said.err) == []
    # the artifact against its source, as given with its credentials: current
    assert main(["verify", str(out), "--source", url, "--json"]) == 0
    said = capsys.readouterr()
    assert _secrets_in(said.out + said.err) == [] and json.loads(said.out)["status"] == "current"


def test_an_error_names_the_url_without_its_credentials(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store.url("/models/missing.pte")
    argv = ["specialize", url, str(tmp_path / "a.pte"), "--backend", "passthrough"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f"ptestore specialize: error: {redacted_url(url)}: no such object"
    )
    assert _secrets_in(err) == []
    assert main([*argv, "--json"]) == 2
    said = capsys.readouterr()
    error = json.loads(said.out)["error"]
    assert error["message"] == f"{redacted_url(url)}: no such object"
    assert error["cause"] == f"FileNotFoundError: {redacted_url(url)}"  # fsspec's own text
    assert _secrets_in(said.out + said.err) == []
    # a URL given to verify as it is: the report names it shown
    assert main(["verify", url, "--json"]) == 2
    said = capsys.readouterr()
    assert _secrets_in(said.out + said.err) == []


def test_one_cache_entry_across_rotated_signatures_and_no_secret_in_it(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    first, rotated = (store.url("/models/mlp.pte", s) for s in SIGNATURES)
    common = ["--cache-dir", str(cache), "--backend", "passthrough", "--json"]
    assert main(["ensure", first, *common]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["created"] is True
    assert main(["ensure", rotated, *common]) == 0
    said = capsys.readouterr()
    hit = json.loads(said.out)
    # the same entry, not a new one made again for the new signature
    assert hit["created"] is False and hit["pte"] == made["pte"]
    assert len(list((cache / "entries").iterdir())) == 1
    # the fingerprint's source identity was checked with the rotated URL (a HEAD of it)
    assert any(f"X-Amz-Signature={SIGNATURES[1]}" in p for p, _ in store.seen)
    assert _secrets_in(json.dumps(made) + said.out + said.err) == []
    for path in cache.rglob("*"):
        if path.is_file():
            assert _secrets_in(path.read_bytes()) == [], path
    (manifest,) = cache.glob("entries/*/manifest.json")
    assert json.loads(manifest.read_text())["source"] == redacted_url(first)
    for argv in (["cache", "ls"], ["cache", "ls", "--json"]):
        assert main([*argv, "--cache-dir", str(cache)]) == 0
        said = capsys.readouterr()
        assert redacted_url(first) in said.out and _secrets_in(said.out + said.err) == []


def test_a_fleet_job_s_outputs_and_index_hold_no_secret(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store.url("/models/mlp.pte")
    job = tmp_path / "job.toml"
    out = tmp_path / "out"
    job.write_text(
        f'destination = "{out}/{{device}}/{{model}}.pte"\nbackends = ["passthrough"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{url}"\n[devices.a]\nsoc = "x"\n'
        '[devices.b]\nsoc = "y"\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["done"] == 2
    assert _secrets_in(said.out + said.err) == []
    files = [p for p in out.rglob("*") if p.is_file()]
    leaves = [p for p in files if p.suffix == ".json" and "ptestore-index" in str(p)]
    assert len([p for p in files if p.suffix == ".pte"]) == 2 and leaves
    for path in files:
        assert _secrets_in(path.read_bytes()) == [], path
    assert redacted_url(url) in "".join(p.read_text() for p in leaves)  # the entries' source
    assert main(["fleet", "plan", str(job), "--json"]) == 0
    said = capsys.readouterr()
    assert _secrets_in(said.out + said.err) == []
    assert main(["verify", "--job", str(job), "--json"]) == 0
    said = capsys.readouterr()
    assert _secrets_in(said.out + said.err) == []


def test_a_trailer_recorded_with_the_whole_url_still_reads_and_shows_it_redacted(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store.url("/models/mlp.pte")
    out = tmp_path / "a.pte"
    assert main(["specialize", url, str(out), "--backend", "passthrough", "--quiet"]) == 0
    record = _record(out)
    record["source"]["url"] = url  # as an earlier ptestore recorded it
    out.write_bytes(replace_trailer(out.read_bytes(), record))
    assert _secrets_in(out.read_bytes()) != []
    for argv in (["inspect", "--json", str(out)], ["verify", str(out), "--source", url]):
        assert main(argv) == 0
        said = capsys.readouterr()
        assert _secrets_in(said.out + said.err) == []
    assert main(["verify", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "intact"
    assert report["provenance"]["source"]["url"] == redacted_url(url)


def test_prune_stale_keeps_an_entry_whose_recorded_url_lost_its_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A private store answers 404 to a request without credentials: the manifest's
    source (recorded redacted) re-opened was "gone", and a current entry removed. A
    recorded URL holding REDACTED is never re-opened: the entry is kept, unknown."""
    cache = tmp_path / "cache"
    with presigned_store({"/models/mlp.pte": DATA}, hide=True) as store:
        url = store.url("/models/mlp.pte")
        argv = ["ensure", url, "--cache-dir", str(cache), "--backend", "passthrough", "--json"]
        assert main(argv) == 0
        made = json.loads(capsys.readouterr().out)
        requests = len(store.seen)
        assert main(["cache", "prune", "--stale", "--cache-dir", str(cache), "--json"]) == 0
        said = capsys.readouterr()
        assert len(store.seen) == requests  # nothing asked of the store
    (entry,) = json.loads(said.out)["stale"]["entries"]
    assert entry["action"] == "kept: unknown"
    assert entry["reason"] == (
        f"its source {redacted_url(url)} was recorded without its URL's credentials "
        "(REDACTED): it is not opened again to judge the entry (give the URL with its "
        "credentials to ensure, which checks it, or remove the entry)"
    )
    assert Path(made["pte"]).is_file() and _secrets_in(said.out + said.err) == []


def test_inspect_html_and_a_destination_with_credentials_are_shown_redacted(
    tmp_path: Path, store: PresignedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store.url("/models/mlp.pte")
    page = tmp_path / "map.html"
    assert main(["inspect", url, "--html", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    assert _secrets_in(text) == [] and redacted_url(url).replace("&", "&amp;") in text
    dst = "memory://secrets2-out/out.pte?token=TOKENsecret4"
    for extra in ([], ["--json"]):
        assert main(["specialize", url, dst, "--backend", "passthrough", *extra]) == 0
        said = capsys.readouterr()
        assert "TOKENsecret4" not in said.out + said.err and _secrets_in(said.out) == []
        assert "memory://secrets2-out/out.pte?token=REDACTED" in said.out


def test_an_index_url_s_credentials_are_neither_printed_recorded_nor_keyed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ptestore.device.indexed import index_fingerprint, index_key
    from ptestore.device.manifest import Manifest
    from ptestore.fleet.select import select_from
    from ptestore.testing.fleet_index import synthetic_entry

    with presigned_store({}) as s:
        index = s.url("/fleet/index.json")
        named = index.partition("?")[0].replace("/fleet/index.json", "/fleet/m/a.pte")
        entry = synthetic_entry("m", "a", root=named.rpartition("/fleet/")[0] + "/fleet")
        entry["pte"]["url"] = named  # the index's own server, its user and password
        doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
        s.state.objects["/fleet/index.json"] = json.dumps(doc).encode()
        base = ["select", index, "--model", "m", "--device", "a"]
        for argv in (base, [*base, "--json"]):
            assert main(argv) == 0, capsys.readouterr()
            said = capsys.readouterr()
            assert _secrets_in(said.out + said.err) == [] and redacted_url(named) in said.out
        choice = select_from(index, "m", "a")
    rotated = index.replace(SIGNATURES[0], SIGNATURES[1])
    profile = DeviceProfile("a", {"soc": "x"})
    assert index_key(index, "m", "a") == index_key(rotated, "m", "a")
    assert index_key(redacted_url(index), "m", "a") == index_key(index, "m", "a")
    fp = index_fingerprint(index, "m", profile, choice)
    manifest = Manifest.of(
        key="k", source=choice.pte["url"], fingerprint=fp, files={}, specialized=False,
        provenance=None, index=index, choice=choice.to_dict(),
    ).to_dict()  # fmt: skip
    assert _secrets_in(json.dumps(manifest)) == []
    assert manifest["index"] == redacted_url(index)
    assert fp == index_fingerprint(rotated, "m", profile, choice)
