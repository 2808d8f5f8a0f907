"""An index read over http(s) whose server redirects the artifact it names to another
host: the storage options' headers followed the redirect (aiohttp drops only
``Authorization``, ``Cookie`` and ``Proxy-Authorization``), so an ``X-Api-Key`` reached
a host the index's rule never let it name. Now such a redirect is refused before any
request reaches that host, by ``fetch``, ``ensure`` and the CLI, saying how to trust it;
a redirect to a trusted origin, or within the index's own, is followed with the headers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.redirect_server import ServerState, redirect_server

import ptestore
from ptestore.cli import main
from ptestore.errors import StorageError
from ptestore.fleet.index_entry import artifact_entry
from ptestore.testing.fleet_index import synthetic_entry

FX = get_fixture("mlp_portable")
assert FX.pte_path is not None
HEADERS = {"X-Api-Key": "sekret", "Authorization": "Bearer tok"}
OPTIONS = {"client_kwargs": {"headers": HEADERS}}

Served = tuple[str, ServerState, str, ServerState, bytes]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """A version 2 index on server A (``/fleet/i.json``) whose entry m/a names
    ``A/m/a.pte``, which A answers with a redirect to ``B/m/a.pte`` (B: another port,
    untrusted), where the artifact is: ``(index URL, A's state, B's URL, B's state, the
    artifact's bytes)``, the requests seen so far cleared."""
    art = tmp_path / "art.pte"
    ptestore.specialize(FX.pte_path, art, backends=["passthrough"], allow_unchanged=True)
    data = art.read_bytes()
    with redirect_server() as (a, a_state), redirect_server() as (b, b_state):
        b_state.objects["/m/a.pte"] = data
        entry = synthetic_entry("m", "a", root=f"{a}/fleet")
        pte = artifact_entry(f"{b}/m/a.pte", {})[0]
        entry.update(pte={**pte, "url": f"{a}/m/a.pte"}, ptd=None, compatibility=[])
        entry.pop("device_digest")
        entry["source"]["url"] = f"{a}/src/m.pte"
        doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
        a_state.objects["/fleet/i.json"] = json.dumps(doc).encode()
        a_state.redirects["/m/a.pte"] = f"{b}/m/a.pte"
        a_state.seen.clear()
        b_state.seen.clear()
        yield f"{a}/fleet/i.json", a_state, b, b_state, data


def _refused(index: str, b: str) -> str:
    a = index.removesuffix("/fleet/i.json")
    return (
        f"{a}/m/a.pte: redirected to {b}/m/a.pte, of origin {b}, not the index's own nor a "
        f"trusted one ({a}): refused, nothing was sent there (the storage options' headers "
        "go with every request of the objects an index read from a server names); to allow "
        f"it, trust that origin: trusted_origins=['{b}'], CLI --trust-origin {b}"
    )


def test_a_redirect_to_an_untrusted_host_is_refused_before_it_is_requested(
    served: Served, tmp_path: Path
) -> None:
    """The reviewer's reproduction: B logged ``X-Api-Key: sekret`` on the HEAD and GETs.
    Now a StorageError naming the index's URL, the redirect's target and the way to
    trust it; B sees no request, nothing is published. Trusted, B gets the request with
    the headers (trusting an origin means sending it the options) and the bytes are
    fetched and verified."""
    index, a_state, b, b_state, data = served
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(StorageError) as caught:
        ptestore.fetch(index, dest, model="m", device="a", storage_options=OPTIONS)
    assert str(caught.value) == _refused(index, b)
    assert b_state.seen == [] and not dest.exists()
    assert ("HEAD", "/m/a.pte") in [(s.method, s.path) for s in a_state.seen]
    ptestore.fetch(index, dest, model="m", device="a", storage_options=OPTIONS, trusted_origins=[b])
    assert dest.read_bytes() == data
    assert {s.method for s in b_state.seen} >= {"HEAD", "GET"}
    assert b_state.header_values("x-api-key") == {"sekret"}


def test_a_redirect_within_the_index_s_own_server_is_followed(
    served: Served, tmp_path: Path
) -> None:
    index, a_state, _, b_state, data = served
    a_state.objects["/store/a.pte"] = data
    a_state.redirects["/m/a.pte"] = "/store/a.pte"
    dest = tmp_path / "m.pte"
    ptestore.fetch(index, dest, model="m", device="a", storage_options=OPTIONS)
    assert dest.read_bytes() == data
    assert "/store/a.pte" in {s.path for s in a_state.seen}
    assert a_state.header_values("x-api-key") == {"sekret"}
    assert b_state.seen == []


def test_ensure_and_the_cli_refuse_it_too(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index, _, b, b_state, data = served
    cache = tmp_path / "cache"
    with pytest.raises(StorageError) as caught:
        ptestore.ensure(index, cache_dir=cache, model="m", device="a", storage_options=OPTIONS)
    assert str(caught.value) == _refused(index, b)
    dest = tmp_path / "cli" / "m.pte"
    fetch = ["fetch", index, str(dest), "--model", "m", "--device", "a"]
    assert main(fetch) == 1 and not dest.exists()
    assert (
        capsys.readouterr().err
        == f"ptestore fetch: failed, nothing published: {_refused(index, b)}\n"
        "ptestore fetch: (--debug prints the full traceback, StorageError included)\n"
    )
    assert b_state.seen == []
    assert main([*fetch, "--trust-origin", b]) == 0 and dest.read_bytes() == data


def test_ensure_s_portable_source_is_held_to_the_index_s_rule(
    served: Served, tmp_path: Path
) -> None:
    """A device the index has no artifact for: ``ensure`` specializes the portable source
    the index names (``A/src/m.pte``), which A redirects to B: refused as the artifact's
    redirect is (it had the rule of a URL given: its headers stripped, B reached)."""
    index, a_state, b, b_state, _ = served
    doc = json.loads(a_state.objects["/fleet/i.json"])
    # made by a backend not installed here: no build for another device, the source is
    doc["entries"][0]["compatibility"] = synthetic_entry("m", "a")["compatibility"]
    doc["entries"][0]["ptd_source"] = None
    art = tmp_path / "art2.pte"  # the source as the index records it
    ptestore.specialize(FX.pte_path, art, backends=["passthrough"], allow_unchanged=True)
    made = artifact_entry(str(art), {})[1].source
    assert made is not None
    doc["entries"][0]["source"].update(sha256=made.sha256, size=made.size)
    a_state.objects["/fleet/i.json"] = json.dumps(doc).encode()
    b_state.objects["/src/m.pte"] = FX.pte_path.read_bytes()
    a_state.redirects["/src/m.pte"] = f"{b}/src/m.pte"
    cache = tmp_path / "cache"
    kw = {"cache_dir": cache, "model": "m", "device": "other", "storage_options": OPTIONS}
    with pytest.raises(StorageError) as caught:
        ptestore.ensure(index, backends=["passthrough"], **kw)
    assert str(caught.value) == _refused(index, b).replace("/m/a.pte", "/src/m.pte")
    assert b_state.seen == []
    got = ptestore.ensure(index, backends=["passthrough"], trusted_origins=[b], **kw)
    assert got.created and got.choice is not None and got.choice["kind"] == "source"
    assert Path(got.pte).exists()
    assert b_state.header_values("x-api-key") == {"sekret"}
