"""A device reading an index, and the files it names, from storage it does not control
(a compromised bucket, a proxy between): what reaches it is bounded and named.

- a ranged read answered with an endless body holds the range and one byte, then is
  refused (the root read whose first GET claims more than a version 3 root may have);
- an answer without an ETag is a StorageError naming the object and the header (not a
  KeyError), so ``ensure`` serves the entry it fetched before;
- an entry of a remote (``s3://``) index names only ``s3://`` URLs: a local path, an
  ``http://`` metadata URL, a local portable source, a ``file://`` packed-weight file are
  refused before any request;
- the URLs an index names are cut and escaped in error messages: a 3 MB URL makes a line
  of a few hundred characters, a line break in one no forged line.

On moto and SeaweedFS where S3 is what the check depends on."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.faulty_proxy import FaultState, faulty_proxy
from support.fixtures import get_fixture
from support.fleetrun import fleet_run
from support.http_store import http_store
from support.s3job import s3_options_toml

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries
from ptestore.errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    ObjectNotFound,
    StorageError,
)
from ptestore.fleet.index import create_index, publish_entries
from ptestore.fleet.index_place import model_segment
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
A = DeviceProfile("a", {"soc": "x", "scale": 2.0})
#: What an endless body sends at most, in 1 MiB pieces.
ENDLESS_PIECES = 128


def _flags(opts: dict[str, Any]) -> list[str]:
    """``opts`` as the CLI's ``-o KEY=VALUE`` flags."""
    return [
        x
        for k, v in opts.items()
        for x in ("-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]


def _via(s3_server: S3TestServer, endpoint: str) -> dict[str, Any]:
    """The server's options with the proxy's endpoint, one attempt per request."""
    return {**s3_server.storage_options, "endpoint_url": endpoint, "retry_attempts": 1}


def _ranged(asks: dict[str, str]) -> bool:
    return bool(asks.get("Range", asks.get("range")))


# --- 1. a ranged read holds no more than it asked for ---------------------------------


@pytest.mark.s3
def test_a_root_read_answered_with_an_endless_body_is_refused(
    s3_server: S3TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The root's first GET claims more than a version 3 root may have (its body not
    read), so its first bytes are read with a ranged GET, answered with an endless
    body: ``select`` read it all (0.9 GB, then a MemoryError and a traceback); now
    the range and one byte, then an IntegrityError naming the root, the range and the
    limit, one error line, exit 1."""
    bucket = s3_server.new_bucket()
    opts = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    create_index(url, storage_options=opts)
    publish_entries(url, [synthetic_entry("m", "a")], opts)
    size = s3_server.client().head_object(Bucket=bucket, Key="fleet/ptestore-index.json")[
        "ContentLength"
    ]

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes | Iterator[bytes]]:
        if method != "GET" or not path.split("?")[0].endswith("/ptestore-index.json"):
            return headers, body
        out = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        if not _ranged(asks):  # claims 100 KB: its body is not read, its head is
            return {**out, "Content-Length": "100000"}, iter([body])
        return out, (body + bytes(1 << 20) for _ in range(ENDLESS_PIECES))

    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        proxy.answer = answer
        via = _via(s3_server, endpoint)
        with pytest.raises(IntegrityError) as info:
            ptestore.select(url, "m", "a", storage_options=via)
        written = _endless_stream(proxy)
        argv = ["select", url, "--model", "m", "--device", "a", *_flags(via)]
        assert main(argv) == 1
        _endless_stream(proxy)
    message = (
        f"{url}: asked the server for Range: bytes=0-{size - 1} ({size} bytes), its answer "
        f"is longer: read no further than {size + 1} bytes, the rest left unread; its bytes "
        "are refused"
    )
    assert str(info.value) == message
    assert written < ENDLESS_PIECES * (1 << 20) // 4, written
    err = capsys.readouterr().err
    assert err == f"ptestore select: error: {message}\n"  # one line, no traceback


def _endless_stream(proxy: FaultState) -> int:
    """What the proxy wrote of the endless body it streamed last (once it ended; the
    claimed root's short one before it is not counted)."""
    while True:
        written = proxy.streamed.get(timeout=60)
        if written > 1 << 20:
            return written


# --- 2. an answer without an ETag ------------------------------------------------------


def _job(tmp: Path, dest: str, extra: str = "") -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\nscale = 3.0\n'
    )
    return job


def _no_etag_on(
    suffix: str,
) -> Callable[[str, str, dict[str, str], dict[str, str], bytes], tuple[dict[str, str], bytes]]:
    """A proxy answer that strips the ETag of the GETs of objects ending with ``suffix``."""

    def answer(
        method: str, path: str, asks: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method == "GET" and path.split("?")[0].endswith(suffix):
            return {k: v for k, v in headers.items() if k.lower() != "etag"}, body
        return headers, body

    return answer


@pytest.mark.s3
def test_an_index_answer_without_an_etag_is_a_storage_error_and_served_offline(
    s3_server: S3TestServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A GET of the catalog answered without its ETag: ``select`` and ``fetch`` raised
    KeyError: 'ETag' (a traceback, exit 1), ``ensure`` too instead of serving the entry
    it fetched before. Now a StorageError naming the object and the missing header:
    exit 1, one line; ``ensure`` serves its entry offline with its usual message."""
    bucket = s3_server.new_bucket()
    extra = s3_options_toml(s3_server.storage_options)
    index = fleet_run(_job(tmp_path, f"s3://{bucket}/fleet", extra), capsys)
    cache = tmp_path / "cache"
    opts = dict(s3_server.storage_options)
    first = ptestore.ensure(index, cache_dir=cache, model="m", device=A, storage_options=opts)
    assert first.created
    with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
        proxy.answer = _no_etag_on("/catalog.json")
        via = _via(s3_server, endpoint)
        with pytest.raises(StorageError) as info:
            ptestore.select(index, "m", A, storage_options=via)
        served = ptestore.ensure(index, cache_dir=cache, model="m", device=A, storage_options=via)
        argv = ["select", index, "--model", "m", "--device", "a", *_flags(via)]
        assert main(argv) == 1
    catalog = str(info.value).partition(": ")[0]
    assert catalog.startswith(f"s3://{bucket}/fleet/ptestore-index.v3-")
    assert catalog.endswith(f"/m/{model_segment('m')}/catalog.json")
    message = (
        f"{catalog}: the GetObject answer has no ETag header: the object's version cannot be "
        "known, its bytes are not used"
    )
    assert str(info.value) == message
    assert not served.created and (served.pte, served.ptd) == (first.pte, first.ptd)
    assert served.choice is not None
    assert served.choice["offline"] == (
        f"served from the cache offline: {message}; this is the artifact the index named "
        "when it was fetched, verified then and unchanged since"
    )
    assert capsys.readouterr().err.splitlines()[0] == f"ptestore select: error: {message}"


# --- 3. what a remote index may name ----------------------------------------------------


def _s3_index(s3_server: S3TestServer) -> tuple[str, str, dict[str, Any]]:
    """An index on S3 with one synthetic entry (m/a, its files under the bucket): the
    bucket, the index's URL and the key of its leaf."""
    bucket = s3_server.new_bucket()
    opts = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    root = create_index(url, storage_options=opts)
    publish_entries(url, [synthetic_entry("m", "a", root=f"s3://{bucket}/fleet")], opts)
    key = f"fleet/{root['layout']['shards']}/m/{model_segment('m')}/t.json"
    return bucket, url, {"key": key, "opts": opts}


def _edit_leaf(
    s3_server: S3TestServer, bucket: str, key: str, change: Callable[[dict[str, Any]], None]
) -> None:
    client = s3_server.client()
    leaf = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    change(leaf["entries"][0])
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(leaf).encode())


def _refusal(leaf: str, field: str, url: str) -> str:
    return (
        f"{leaf}: entry m/a {field} = {url!r}: must be a URL on the index's own store "
        "(s3://) (an index read from a store names only objects of its protocol: a local "
        "path, file://, or a URL of another protocol or service is never opened nor "
        "requested)"
    )


@pytest.mark.s3
def test_a_remote_index_naming_a_local_file_is_refused_before_it_is_opened(
    s3_server: S3TestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pte.url = "/etc/passwd"`` (and its size) in an S3 index: ``fetch`` opened it and
    copied it into DEST.part. Now a FormatError naming the leaf, the entry, the field and
    the URL, before anything is opened; ``select`` refuses it too (exit 2)."""
    bucket, url, info = _s3_index(s3_server)
    secret = tmp_path / "secret.pte"
    secret.write_bytes(b"not for the index to name")

    def local(entry: dict[str, Any]) -> None:
        entry["pte"].update(url=str(secret), size=secret.stat().st_size)

    _edit_leaf(s3_server, bucket, info["key"], local)
    leaf = f"s3://{bucket}/{info['key']}"
    dest = tmp_path / "dev" / "m.pte"
    for name in (str(secret), f"file://{secret}", "memory://m.pte", "local.pte"):
        _edit_leaf(s3_server, bucket, info["key"], lambda e, n=name: e["pte"].update(url=n))
        with pytest.raises(FormatError) as caught:
            ptestore.fetch(url, dest, model="m", device="a", storage_options=info["opts"])
        assert str(caught.value) == _refusal(leaf, "pte.url", name)
        assert not dest.parent.exists()  # nothing opened, nothing written
    argv = ["select", url, "--model", "m", "--device", "a", *_flags(info["opts"])]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"ptestore select: error: {_refusal(leaf, 'pte.url', name)}\n"


@pytest.mark.s3
def test_a_remote_index_naming_an_http_url_is_refused_before_it_is_requested(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    """An S3 index naming ``http://127.0.0.1:.../latest/meta-data/...`` (a cloud
    metadata service): it was requested. Now refused, the server never asked."""
    bucket, url, info = _s3_index(s3_server)
    with http_store({}) as (base, state):
        named = f"{base}/latest/meta-data/iam/security-credentials/role"
        _edit_leaf(s3_server, bucket, info["key"], lambda e: e["ptd"].update(url=named))
        dest = tmp_path / "dev" / "m.pte"
        with pytest.raises(FormatError) as caught:
            ptestore.fetch(url, dest, model="m", device="a", storage_options=info["opts"])
        assert state.requests == []
    leaf = f"s3://{bucket}/{info['key']}"
    assert str(caught.value) == _refusal(leaf, "ptd.url", named)


def _served_index(base: str, objects: dict[str, bytes], name: str, pte_url: str) -> str:
    """A version 2 index (one object, as a static server holds it) with one synthetic
    entry m/a whose ``pte.url`` is ``pte_url``, put into ``objects`` as ``name``; its
    URL at ``base``."""
    entry = synthetic_entry("m", "a", root=f"{base}/fleet")
    entry["pte"]["url"] = pte_url
    doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
    objects[f"/fleet/{name}"] = json.dumps(doc).encode()
    return f"{base}/fleet/{name}"


def test_an_index_read_from_a_server_names_only_that_server(tmp_path: Path) -> None:
    """An index read over ``http://`` naming a file on another host or port: the device's
    storage options (an ``Authorization`` header) went with the requests to it. Now
    refused before anything there is requested; one of the index's own server is
    handed out as before."""
    header = {"client_kwargs": {"headers": {"Authorization": "Bearer DEVICE-TOKEN"}}}
    with http_store({}) as (base, state), http_store({}) as (elsewhere, other):
        named = f"{elsewhere}/m.pte"
        index = _served_index(base, state.objects, "a.json", named)
        with pytest.raises(FormatError) as caught:
            ptestore.fetch(
                index, tmp_path / "dev" / "m.pte", model="m", device="a",
                storage_options=header,
            )  # fmt: skip
        assert other.requests == []
        own = f"{base}/fleet/m/a.pte"
        same = _served_index(base, state.objects, "b.json", own.replace("://", "://u@"))
        chosen = ptestore.select(same, "m", "a", storage_options=header)
    host, port = base.removeprefix("http://").split(":")
    assert str(caught.value) == (
        f"{index}: entry m/a pte.url = {named!r}: must be a URL on the index's own server "
        f"(http://{host}:{port}) (an index read from a server names only objects of that "
        "server: the storage options (headers, credentials) are never sent to another "
        "host or port unless trusted (trusted_origins=, CLI --trust-origin))"
    )
    assert chosen.kind == "artifact" and chosen.pte["url"] == own.replace("://", "://u@")


def test_origins_compare_host_and_port_as_a_client_reaches_them() -> None:
    """The same server however the URL spells it (letter case, the default port, user
    information); another port, host or protocol is another server."""
    from ptestore.fleet.index_bounds import check_named_url

    index = "https://Store.example/fleet/ptestore-index.json"
    for named in ("https://store.example/m.pte", "https://u:p@STORE.example.:443/m.pte"):
        check_named_url(named, index, "entry m/a pte.url")
    for named in (
        "https://store.example:8443/m.pte",
        "https://store.example.evil/m.pte",
        "https://evil@host/m.pte",
        "http://store.example/m.pte",
        "https://[::1]/m.pte",
    ):
        with pytest.raises(FormatError, match="must be a URL on the index's own"):
            check_named_url(named, index, "entry m/a pte.url")
    check_named_url("https://[::1]:443/m.pte", "https://[::1]/i.json", "entry m/a pte.url")


@pytest.mark.s3
def test_a_remote_index_naming_a_local_portable_source_is_not_specialized(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    """Nothing fits the device: ``ensure`` falls back to the portable source the index
    names; a local ``.pte`` named by an S3 index was specialized. Now refused, nothing
    read nor made."""
    assert EXT.pte_path is not None
    bucket, url, info = _s3_index(s3_server)
    source = str(EXT.pte_path)
    _edit_leaf(s3_server, bucket, info["key"], lambda e: e["source"].update(url=source))
    cache = tmp_path / "cache"
    with pytest.raises(FormatError) as caught:
        ptestore.ensure(
            url, cache_dir=cache, model="m", device="z", backends=[SPEC],
            storage_options=info["opts"],
        )  # fmt: skip
    assert str(caught.value) == _refusal(f"s3://{bucket}/{info['key']}", "source.url", source)
    assert list_entries(cache) == []


@pytest.mark.s3
def test_a_remote_index_naming_a_local_packed_weight_file_is_refused(
    s3_server: S3TestServer,
) -> None:
    """The XNNPACK packed-weight file ``select`` reports for this CPU (what ``fetch`` and
    ``ensure`` then download) is held to the same rule; one made for another CPU is not
    reported, nor looked at."""
    bucket, url, info = _s3_index(s3_server)
    packed = {"url": "file:///etc/passwd", "size": 100, "sha256": "sha256:" + "0" * 64}

    def add(entry: dict[str, Any]) -> None:
        entry["xnnpack"] = {**packed, "cpu": "cpu-x"}

    _edit_leaf(s3_server, bucket, info["key"], add)
    # A packed-weight field that breaks a rule is a failed delivery (the device makes its
    # own file), never a URL requested: not reported, and the reason says why.
    chosen = ptestore.select(url, "m", "a", storage_options=info["opts"], cpu="cpu-x")
    assert chosen.kind == "artifact" and chosen.xnnpack is None
    assert chosen.xnnpack_error is not None
    other = ptestore.select(url, "m", "a", storage_options=info["opts"], cpu="cpu-y")
    assert other.kind == "artifact" and other.xnnpack is None


def test_a_local_index_names_what_it_names() -> None:
    """An index of this machine (a local file, memory:// of this process, an object) is
    the device's own: its entries may name any URL, as before."""
    from ptestore.fleet.index_bounds import check_named_url

    for index in ("/srv/fleet/ptestore-index.json", "memory://f/ptestore-index.json", "<index>"):
        for named in ("/etc/m.pte", "s3://b/m.pte", "https://h/m.pte", "memory://m.pte"):
            check_named_url(named, index, "entry m/a pte.url")
    check_named_url("s3://other-bucket/m.pte", "s3://b/ptestore-index.json", "entry m/a pte.url")
    for named in ("/etc/m.pte", "file:///m.pte", "https://h/m.pte", "memory://m", "gs://b/m"):
        with pytest.raises(FormatError, match=r"^s3://b/i\.json: entry m/a pte\.url = "):
            check_named_url(named, "s3://b/i.json", "entry m/a pte.url")


# --- 4. an index's URLs in error messages -------------------------------------------


def _local_index(tmp: Path, pte_url: str) -> str:
    """A local index whose entry m/a names ``pte_url`` (and no .ptd)."""
    url = str(tmp / "idx" / "ptestore-index.json")
    root = create_index(url)
    publish_entries(url, [synthetic_entry("m", "a", root=str(tmp / "idx"))], {})
    leaf = tmp / "idx" / root["layout"]["shards"] / "m" / model_segment("m") / "t.json"
    value = json.loads(leaf.read_text())
    entry = value["entries"][0]
    entry["ptd"] = None
    entry["pte"]["url"] = pte_url
    entry.pop("device_digest")  # synthetic: the profile recorded is the device's own
    leaf.write_text(json.dumps(value))
    return url


def test_a_long_url_from_an_index_makes_a_short_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pte.url = "/tmp/" + "a" * 3_000_000``: fetch's error (and the CLI's line) was
    3 MB. Now the URL is cut to 300 characters with its length, in the exception too."""
    long = "/tmp/" + "a" * 3_000_000
    index = _local_index(tmp_path, long)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(ConfigurationError) as info:  # a name too long: bad input
        ptestore.fetch(index, dest, model="m", device="a")
    cut = f"{long[:300]}... (3000005 characters)"
    name = f"'{'a' * 40}'... (3000000 characters)"
    assert str(info.value) == (
        f"{cut}: cannot open for reading: File name too long (the name {name} is 3000000 "
        "bytes long, over the file system's limit of 255 bytes per name (NAME_MAX))"
    )
    assert main(["fetch", index, str(dest), "--model", "m", "--device", "a"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"ptestore fetch: error: {info.value!s}" and len(err[0]) < 1000
    assert len(err) == 2 and err[1].startswith("ptestore fetch: (--debug prints")


def test_a_line_break_in_a_url_from_an_index_starts_no_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL holding a line break split fetch's error line: the second half read as a
    line of its own ("ptestore fetch: error: forged.pte: no such file"). Now escaped,
    in the exception and on the terminal; ``ensure`` too."""
    forged = str(tmp_path / "x\nptestore fetch: error: forged.pte")
    index = _local_index(tmp_path, forged)
    shown = forged.replace("\n", "\\n")
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(ObjectNotFound) as info:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(info.value) == f"{shown}: no such file"
    with pytest.raises(ObjectNotFound) as ensured:
        ptestore.ensure(index, cache_dir=tmp_path / "cache", model="m", device="a")
    assert str(ensured.value) == f"{shown}: no such file"
    assert main(["fetch", index, str(dest), "--model", "m", "--device", "a"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"ptestore fetch: error: {shown}: no such file"
    assert not any(line.startswith("ptestore fetch: error: forged") for line in err)


def test_a_warning_s_names_are_one_line_during_a_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The names a warning embeds (``ensure``'s offline reason names the index and why)
    are one line of a bounded length while a command runs, as the error line is."""
    import argparse

    from ptestore._log import get_logger
    from ptestore.cli.exits import guarded

    def run(args: argparse.Namespace) -> int:
        get_logger("ptestore.test").warning("%s: %s", "s3://b/x\nforged", "a" * 50_000)
        return 0

    assert guarded("x")(run)(argparse.Namespace(verbose=1)) == 0
    err = capsys.readouterr().err
    # A run longer than any local path (4096) is cut, one as long shown whole.
    cut = f"{'a' * 4096}... (50000 characters)"
    assert err == f"ptestore.test: WARNING: s3://b/x\\nforged: {cut}\n"
    assert os.linesep not in err[:-1]
