"""An index read over http(s) naming files on another server the caller trusts (an API
serving the index, a CDN its artifacts): refused unless that origin is given
(``trusted_origins=``, CLI ``--trust-origin``), then fetched and verified; a URL of
another scheme stays refused, trusted or not; a malformed origin is a usage error
naming it before anything is read; a version 3 index over http says what to serve."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.http_store import StoreState, http_store

import ptestore
from ptestore.cli import main
from ptestore.errors import ConfigurationError, FormatError
from ptestore.fleet.index import create_index, publish_entries
from ptestore.fleet.index_bounds import check_named_url, trusted_origins
from ptestore.fleet.index_entry import artifact_entry
from ptestore.testing.fleet_index import synthetic_entry

FX = get_fixture("mlp_portable")
assert FX.pte_path is not None
FIELD = "entry m/a pte.url"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, StoreState, str, StoreState, bytes]]:
    """A version 2 index on one server (``/fleet/i.json``) whose entry m/a names an
    artifact on a second server (another port: "the CDN"): ``(index URL, its state,
    CDN origin, its state, the artifact's bytes)``, the CDN's requests cleared."""
    art = tmp_path / "art.pte"
    ptestore.specialize(FX.pte_path, art, backends=["passthrough"], allow_unchanged=True)
    data = art.read_bytes()
    with http_store({}) as (base, state), http_store({"/m/a.pte": data}) as (cdn, cdn_state):
        entry = synthetic_entry("m", "a", root=f"{base}/fleet")
        entry.update(pte=artifact_entry(f"{cdn}/m/a.pte", {})[0], ptd=None, compatibility=[])
        entry.pop("device_digest")
        entry["source"]["url"] = f"{base}/src/m.pte"
        doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
        state.objects["/fleet/i.json"] = json.dumps(doc).encode()
        cdn_state.requests.clear()
        yield f"{base}/fleet/i.json", state, cdn, cdn_state, data


def _refused(index: str, named: str) -> str:
    host, port = index.removeprefix("http://").split("/")[0].split(":")
    return (
        f"{index}: {FIELD} = {named!r}: must be a URL on the index's own server "
        f"(http://{host}:{port}) (an index read from a server names only objects of that "
        "server: the storage options (headers, credentials) are never sent to another host "
        "or port unless trusted (trusted_origins=, CLI --trust-origin))"
    )


def test_a_trusted_origin_s_files_are_fetched_and_verified(
    served: tuple[str, StoreState, str, StoreState, bytes], tmp_path: Path
) -> None:
    """Without the origin: a FormatError naming the field, the URL and the way to trust
    it, nothing requested of the CDN; with it: fetched, verified, the bytes the CDN
    holds."""
    index, _, cdn, cdn_state, data = served
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(FormatError) as caught:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(caught.value) == _refused(index, f"{cdn}/m/a.pte")
    assert cdn_state.requests == [] and not dest.exists()
    result = ptestore.fetch(index, dest, model="m", device="a", trusted_origins=[cdn + "/"])
    assert dest.read_bytes() == data
    assert [f["url"] for f in result.files] == [f"{cdn}/m/a.pte"]
    assert cdn_state.requests != []
    chosen = ptestore.select(index, "m", "a", trusted_origins=[cdn.upper()])
    assert chosen.kind == "artifact" and chosen.pte["url"] == f"{cdn}/m/a.pte"


def test_ensure_and_the_cli_take_the_trusted_origins(
    served: tuple[str, StoreState, str, StoreState, bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    index, _, cdn, cdn_state, data = served
    cache = tmp_path / "cache"
    with pytest.raises(FormatError, match="unless trusted"):
        ptestore.ensure(index, cache_dir=cache, model="m", device="a")
    assert cdn_state.requests == []
    got = ptestore.ensure(index, cache_dir=cache, model="m", device="a", trusted_origins=[cdn])
    assert Path(got.pte).read_bytes() == data
    select = ["select", index, "--model", "m", "--device", "a"]
    assert main(select) == 2
    assert (
        capsys.readouterr().err == f"ptestore select: error: {_refused(index, cdn + '/m/a.pte')}\n"
    )
    assert main([*select, "--trust-origin", "http://other.example", "--trust-origin", cdn]) == 0
    assert capsys.readouterr().out.startswith(f"artifact: {cdn}/m/a.pte\n")
    dest = tmp_path / "cli" / "m.pte"
    fetch = ["fetch", index, str(dest), "--model", "m", "--device", "a"]
    assert main(fetch) == 2 and not dest.exists()
    assert main([*fetch, "--trust-origin", cdn]) == 0 and dest.read_bytes() == data
    capsys.readouterr()
    cli_cache = str(tmp_path / "cli-cache")
    ensure = ["ensure", index, "--cache-dir", cli_cache, "--model", "m", "--device", "a"]
    assert main(ensure) == 2
    assert main([*ensure, "--trust-origin", cdn]) == 0
    assert Path(capsys.readouterr().out.splitlines()[0]).read_bytes() == data


def test_origins_compare_as_a_client_reaches_them() -> None:
    """Letter case, a final dot and the default port aside; another port or scheme is
    another origin."""
    trusted = trusted_origins(["https://CDN.example.com", "http://[::1]:8080/"])
    index = "https://api.example.com/fleet/i.json"
    for named in (
        "https://cdn.example.com/m.pte",
        "https://cdn.example.com.:443/a/b.pte?v=1",
        "http://[::1]:8080/m.pte",
    ):
        check_named_url(named, index, FIELD, trusted)
    for named in ("https://cdn.example.com:8443/m.pte", "http://cdn.example.com/m.pte"):
        with pytest.raises(FormatError, match=r"must be a URL on the index.s own"):
            check_named_url(named, index, FIELD, trusted)


def test_another_scheme_stays_refused_trusted_or_not() -> None:
    """From an http(s) index a local path, file://, s3:// or memory:// is refused even
    when its host is a trusted one's; from an s3:// index an http(s) URL stays refused
    (trust is for an index read from a server)."""
    trusted = trusted_origins(["https://cdn.example.com", "http://cdn.example.com"])
    index = "https://api.example.com/fleet/i.json"
    for named in (
        "/etc/passwd",
        "file:///etc/passwd",
        "s3://cdn.example.com/m.pte",
        "memory://cdn.example.com/m.pte",
    ):
        with pytest.raises(FormatError) as caught:
            check_named_url(named, index, FIELD, trusted)
        assert "must be a URL on the index's own store (https://)" in str(caught.value)
    with pytest.raises(FormatError, match=r"own store \(s3://\)"):
        check_named_url("https://cdn.example.com/m.pte", "s3://b/i.json", FIELD, trusted)


_MALFORMED = [
    ("https://cdn.example.com/models", "it has a path ('/models')"),
    ("https://cdn.example.com/?x=1", "it has a query"),
    ("https://cdn.example.com#f", "it has a fragment"),
    ("https://user@cdn.example.com", "it holds user information"),
    ("ftp://cdn.example.com", "not an http:// or https:// URL"),
    ("s3://bucket", "not an http:// or https:// URL"),
    ("cdn.example.com", "not an http:// or https:// URL"),
    ("https://", "it names no host"),
    ("https://cdn.example.com :8080", "it holds a space or a control character"),
]


@pytest.mark.parametrize(("value", "problem"), _MALFORMED)
def test_a_malformed_origin_is_a_usage_error_naming_it(
    value: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = (
        f"trusted origin {value!r} (trusted_origins=, CLI --trust-origin): must be an "
        f"origin, http(s)://HOST[:PORT] (e.g. https://cdn.example.com): {problem}"
    )
    shown = message.replace("://user@", "://REDACTED@")  # an error shows no credentials
    with pytest.raises(ConfigurationError) as caught:
        trusted_origins([value])
    assert str(caught.value) == shown
    with http_store({}) as (base, state):
        argv = ["select", f"{base}/i.json", "--model", "m", "--device", "a"]
        assert main([*argv, "--trust-origin", value]) == 2
        assert state.requests == []  # refused before the index is read
    assert capsys.readouterr().err == f"ptestore select: error: {shown}\n"


def test_a_port_that_is_not_a_number_and_one_string_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^trusted origin 'https://cdn:http' "):
        trusted_origins(["https://cdn:http"])
    with pytest.raises(ConfigurationError) as caught:
        trusted_origins("https://cdn.example.com")
    assert str(caught.value) == (
        "trusted_origins must be a list of origins, not one string: got 'https://cdn.example.com'"
    )


def test_a_version_3_index_over_http_says_what_to_serve(tmp_path: Path) -> None:
    """Its nodes are read with version tokens, which http objects have not: the error
    said "compare-and-swap (publish mode 'if-match') needs ...", about writing; now what
    a reader can do instead, before any node is read."""
    root = tmp_path / "idx"
    url = str(root / "ptestore-index.json")
    create_index(url)
    publish_entries(url, [synthetic_entry("m", "a", root=str(root))], {})
    objects = {"/" + p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*.json")}
    with http_store(objects) as (base, state):
        index = f"{base}/ptestore-index.json"
        with pytest.raises(ConfigurationError) as caught:
            ptestore.select(index, "m", "a")
        assert [r[1] for r in state.requests if r[0] == "GET"] == ["/ptestore-index.json"]
    assert str(caught.value) == (
        f"{index}: a version 3 (sharded) index is read with version tokens, which http:// "
        "objects do not have: serve a version 2 index there (a job's index_version = 2, or "
        "this index as ptestore.fleet.index.load_index returns it, written as one object), "
        "or read this one from its store (s3://, a local file)"
    )
