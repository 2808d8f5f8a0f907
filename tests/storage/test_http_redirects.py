"""Where an ``http(s)://`` read may be redirected, and with what (ptestore/storage/redirects.py):
a URL the caller gives follows a redirect to another origin without the headers of the
storage options (an API answering with a presigned object-store URL still works, the store
never sees the API's key); within ``index_redirects`` (the objects an index read over
http(s) names) a redirect outside the allowed origins is refused before anything is sent
there, every request of a loader alike (``info``'s HEAD and GET, a ranged GET); within
them the headers go. The filesystem stays one per option set in fsspec's cache, and
pickles."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import aiohttp
import pytest
from support.redirect_server import ServerState, redirect_server

from ptestore.errors import ConfigurationError, StorageError
from ptestore.storage.loaders import open_loader
from ptestore.storage.redirects import RedirectGuard, guarded_options, index_redirects
from ptestore.storage.types import StorageURL

DATA = bytes(range(256)) * 40
SECRETS = {"X-Api-Key": "sekret", "Private-Token": "pt", "Authorization": "Bearer tok"}

Servers = tuple[str, ServerState, str, ServerState]


@pytest.fixture
def servers() -> Iterator[Servers]:
    """Two servers, A and B (another port: another origin); B holds ``/x``."""
    with redirect_server() as (a, a_state), redirect_server() as (b, b_state):
        b_state.objects["/x"] = DATA
        yield a, a_state, b, b_state


def _options(**more: object) -> dict[str, object]:
    return {"client_kwargs": {"headers": dict(SECRETS), **more}}


def test_a_given_url_s_headers_do_not_follow_a_redirect_to_another_origin(
    servers: Servers,
) -> None:
    """The API (A) sees the headers; the host it redirects to (B) gets the HEAD and the
    ranged GETs without any of them (aiohttp alone dropped Authorization only), the
    ``Range`` kept, and the bytes are read."""
    a, a_state, _, b_state = servers
    a_state.redirects["/x"] = servers[2] + "/x"
    loader = open_loader(a + "/x", **_options())
    try:
        assert loader.size() == len(DATA)
        assert bytes(loader.load(100, 50)) == DATA[100:150]
        assert bytes(loader.load(5000, 10)) == DATA[5000:5010]
    finally:
        loader.close()
    assert {s.method for s in b_state.seen} == {"HEAD", "GET"}
    for name in SECRETS:
        assert b_state.header_values(name) == {None}, name
        assert a_state.header_values(name) == {SECRETS[name]}, name
    assert {s.headers.get("range") for s in b_state.seen if s.method == "GET"} == {
        "bytes=100-149",
        "bytes=0-10239",  # its second read: the object whole (WHOLE_READ_LIMIT)
    }


def test_a_given_url_s_cookies_do_not_follow_a_redirect_to_another_origin(
    servers: Servers,
) -> None:
    """Cookies given in the options live in the session's jar, without a domain: aiohttp
    sent them on every hop, to B too (only a ``Cookie`` header is dropped)."""
    a, a_state, b, b_state = servers
    a_state.redirects["/x"] = b + "/x"
    loader = open_loader(a + "/x", client_kwargs={"cookies": {"session": "SEKRET"}})
    try:
        assert bytes(loader.load(0, 10)) == DATA[:10]
    finally:
        loader.close()
    assert a_state.header_values("cookie") == {"session=SEKRET"}
    assert b_state.seen and b_state.header_values("cookie") == {None}


def test_a_redirect_within_the_origin_keeps_the_headers(servers: Servers) -> None:
    a, a_state, _, _ = servers
    a_state.objects["/y"] = DATA
    a_state.redirects["/x"] = "/y"
    loader = open_loader(a + "/x", **_options())
    try:
        assert bytes(loader.load(7, 3)) == DATA[7:10]
    finally:
        loader.close()
    assert {s.path for s in a_state.seen} == {"/x", "/y"}
    for name, value in SECRETS.items():
        assert a_state.header_values(name) == {value}


def _refused(named: str, target: str, allowed: str) -> str:
    origin = target.split("/x")[0]
    return (
        f"{named}: redirected to {target}, of origin {origin}, not the index's own nor a "
        f"trusted one ({allowed}): refused, nothing was sent there (the storage options' "
        "headers go with every request of the objects an index read from a server names); "
        f"to allow it, trust that origin: trusted_origins=['{origin}'], CLI --trust-origin "
        f"{origin}"
    )


def test_an_index_s_objects_are_refused_a_redirect_outside_its_origins(
    servers: Servers,
) -> None:
    """Within ``index_redirects`` of an index on A: A's object redirected to B is
    refused at its HEAD (fsspec's ``info`` would call it a missing object) and, once
    opened, at a ranged GET; B never sees a request. B trusted: read, the headers sent."""
    a, a_state, b, b_state = servers
    a_state.redirects["/x"] = b + "/x"
    index = a + "/fleet/i.json"
    with index_redirects(index, None):
        with pytest.raises(StorageError) as caught:
            open_loader(a + "/x", **_options())
        assert str(caught.value) == _refused(a + "/x", b + "/x", a)
        assert type(caught.value) is StorageError
        # final, not retried (under aiohttp's ClientOSError it was: six times, backing off)
        assert [s.method for s in a_state.seen if s.path == "/x"] == ["HEAD", "GET"]  # info
        a_state.objects["/x"] = DATA
        del a_state.redirects["/x"]
        loader = open_loader(a + "/x", **_options())
        try:
            a_state.redirects["/x"] = b + "/x"  # only now: the GET is redirected
            with pytest.raises(StorageError) as caught:
                loader.load(0, 10)
            assert str(caught.value) == _refused(a + "/x", b + "/x", a)
        finally:
            loader.close()
    assert b_state.seen == []
    with index_redirects(index, [b + "/"]):
        loader = open_loader(a + "/x", **_options())
        try:
            assert bytes(loader.load(0, 10)) == DATA[:10]
        finally:
            loader.close()
    assert b_state.header_values("x-api-key") == {"sekret"}
    assert b_state.header_values("private-token") == {"pt"}


def test_an_index_not_read_over_http_changes_nothing(servers: Servers) -> None:
    """What an index of this machine or of a store names gets the rule of a URL given."""
    a, a_state, b, b_state = servers
    a_state.redirects["/x"] = b + "/x"
    for index in ("/local/i.json", "s3://bucket/i.json", "memory://i.json"):
        with index_redirects(index, None):
            loader = open_loader(a + "/x", **_options())
            try:
                assert bytes(loader.load(0, 3)) == DATA[:3]
            finally:
                loader.close()
    assert b_state.header_values("x-api-key") == {None}


def test_the_filesystem_is_cached_by_its_options_and_rule_and_pickles(servers: Servers) -> None:
    """Two loaders with the same options share fsspec's instance (the guard's text is its
    rule: no address in the cache key); another rule (an index's scope) is another
    instance; a pickled filesystem comes back as the same one."""
    a, a_state, _, _ = servers
    a_state.objects["/x"] = a_state.objects["/z"] = DATA
    first, second = open_loader(a + "/x", **_options()), open_loader(a + "/z", **_options())
    with index_redirects(a + "/i.json", None):
        scoped = open_loader(a + "/x", **_options())
    try:
        assert first.fs is second.fs
        assert scoped.fs is not first.fs
        assert "0x" not in repr(first.fs.storage_options)
        assert pickle.loads(pickle.dumps(first.fs)) is first.fs
    finally:
        for loader in (first, second, scoped):
            loader.close()


def test_the_guard_is_added_to_what_the_options_give() -> None:
    url = StorageURL.of("https://api.example.com/x.pte")
    given = {"headers": {"X-Key": "v", "Range": "bytes=0-1"}, "middlewares": ()}
    opts = guarded_options(url, given)
    guard = opts["middlewares"][-1]
    assert isinstance(guard, RedirectGuard) and not guard.refuse
    assert guard.strip == ("authorization", "x-key")
    assert guard.allowed == (("https", "api.example.com", 443),)
    assert opts["get_client"].guard == guard and given["middlewares"] == ()
    with index_redirects("http://idx.example:81/i.json", ["https://CDN.example.com."]):
        scoped = guarded_options(url, {})["get_client"].guard
    assert scoped.refuse
    assert scoped.allowed == (
        ("http", "idx.example", 81),
        ("https", "api.example.com", 443),
        ("https", "cdn.example.com", 443),
    )


async def _no_middlewares(**kwargs: object) -> aiohttp.ClientSession:
    kwargs.pop("middlewares", None)
    return aiohttp.ClientSession(**kwargs)  # type: ignore[arg-type]


def test_a_get_client_that_drops_the_guard_is_refused(servers: Servers) -> None:
    a, a_state, _, _ = servers
    a_state.objects["/x"] = DATA
    with pytest.raises(StorageError) as caught:
        open_loader(a + "/x", get_client=_no_middlewares)
    assert str(caught.value) == (
        f"{a}/x: stat failed: storage option get_client={_no_middlewares!r}: the aiohttp "
        "session it made does not take the middlewares it was given (middlewares=): "
        "ptestore's guard of redirects must be among them; pass them on to "
        "aiohttp.ClientSession"
    )
    assert a_state.seen == []


def test_an_aiohttp_without_client_middlewares_is_refused(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = servers[0]
    monkeypatch.setattr(aiohttp, "__version__", "3.11.18")
    with pytest.raises(ConfigurationError) as caught:
        open_loader(a + "/x")
    assert str(caught.value) == (
        f"{a}/x: reading http(s):// needs aiohttp 3.12 or later (its client middlewares "
        "keep the storage options' headers from the other hosts a redirect names), found "
        "3.11.18: pip install 'aiohttp>=3.12'"
    )
