"""``fetch URL --xnnpack-cache`` (an artifact fetched by its URL, no index) takes its
packed-weight file from the XNNPACK record beside the artifact, read from the store: the
record is held to the rules of an index read there (docs/fleet.md, "What an index may
name"). Its ``xnnpack`` field's form is checked (a size ``true`` or ``-5``, ``entries
-1``, a ``chunks_root`` that is no digest were taken); from S3 its ``url`` names only
``s3://`` objects (a local file was opened, ``/etc/passwd`` and a local ``.xpwc``
installed; an ``http://`` metadata-like URL was requested); from a server only objects of
its origin, a redirect to another refused (the user's ``Authorization`` header went to
another host). Each refusal is a delivery that failed after the pair was published,
naming the record, the field and the value, and nothing is requested or installed; a
re-fetch that fails says the packed-weight file installed earlier was kept.

One real packed-weight file is made (a fleet run on this machine, whose CPU the device
declares); each test copies it with its artifact and a record it changes."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.delta import packed_job
from support.fixtures import get_fixture
from support.redirect_server import ServerState, redirect_server

import ptestore
from ptestore._text import shown
from ptestore.cli import main
from ptestore.errors import ConfigurationError, IntegrityError, PartialPublish, StorageError
from ptestore.fleet.index import load_index
from ptestore.testing.moto import MotoS3
from ptestore.testing.runtime import runtime_unavailable

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

#: The rule of a record read from a store (as an index's).
STORE_RULE = (
    "must be a URL on the record's own store (s3://) (a record read from a store names "
    "only objects of its protocol: a local path, file://, or a URL of another protocol or "
    "service is never opened nor requested)"
)
SERVER_RULE = (
    "must be a URL on the record's own server (http://127.0.0.1:{port}) (a record read "
    "from a server names only objects of that server: the storage options (headers, "
    "credentials) are never sent to another host or port unless trusted "
    "(trusted_origins=, CLI --trust-origin))"
)
TOKEN = {"client_kwargs": {"headers": {"Authorization": "Bearer s3cr3t"}}}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A fleet run's artifact, its packed-weight file and its record, by name
    (``m.pte``, ``m.xnnpack-<id>.xpwc``, ``m.xpwc.json``)."""
    tmp = tmp_path_factory.mktemp("packed-by-url")
    source = get_fixture("mlp_xnnpack").pte_path
    assert source is not None
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["fleet", "run", str(packed_job(tmp, source, str(tmp / "out"))), "--json"]) == 0
    run = json.loads(out.getvalue())
    assert run["pairs"][0]["xnnpack"].startswith("XNNPACK packed-weight file made: ")
    (entry,) = load_index(run["index"])["entries"]
    files = [Path(entry["pte"]["url"]), Path(entry["xnnpack"]["url"])]
    files.append(files[0].with_name("m.xpwc.json"))
    return {f.name: f.read_bytes() for f in files}


def _packed_name(made: dict[str, bytes]) -> str:
    return next(n for n in made if n.endswith(".xpwc"))


def _record(made: dict[str, bytes], changed: dict[str, Any]) -> bytes:
    """The record, its ``xnnpack`` field's values ``changed``."""
    record = json.loads(made["m.xpwc.json"])
    record["xnnpack"].update(changed)
    return json.dumps(record).encode()


def _local_store(made: dict[str, bytes], where: Path, **changed: Any) -> str:
    """The run's files in the directory ``where`` (the record naming the copy, then
    ``changed``); the artifact's path."""
    where.mkdir(parents=True)
    for name, data in made.items():
        (where / name).write_bytes(data)
    url = str(where / _packed_name(made))
    (where / "m.xpwc.json").write_bytes(_record(made, {"url": url, **changed}))
    return str(where / "m.pte")


def _nothing_packed(dest: Path) -> None:
    assert [p.name for p in dest.parent.iterdir()] == ["m.pte"]


def _refused(fetch: Callable[[], object], kind: type[StorageError] = PartialPublish) -> str:
    """The error of ``fetch`` (a :class:`PartialPublish`: the pair was published; a
    :class:`StorageError` when it was already current)."""
    with pytest.raises(kind) as err:
        fetch()
    return str(err.value)


@pytest.mark.parametrize(
    ("name", "value", "limit"),
    [
        ("size", True, "an integer or null"),
        ("size", -5, "an integer >= 0 or null"),
        ("entries", -1, "an integer >= 0 or null"),
        ("chunks_root", "sha256-tree:xyz", "'sha256-tree:<64 hex digits>' or null"),
        ("sha256", "md5:00", "'sha256:<64 hex digits>' or null"),
    ],
)
def test_a_malformed_field_of_the_record_is_refused_before_it_is_used(
    made: dict[str, bytes], tmp_path: Path, name: str, value: object, limit: str
) -> None:
    src = _local_store(made, tmp_path / "store", **{name: value})
    dest = tmp_path / "dev" / "m.pte"
    text = _refused(lambda: ptestore.fetch(src, dest, xnnpack_cache=True))
    assert text == (
        f"{tmp_path / 'store' / 'm.xpwc.json'}: record xnnpack.{name} = {value!r}: must be "
        f"{limit}; {dest} was published, its XNNPACK packed-weight file was not (the "
        f"XNNPACK record beside {src} is malformed)"
    )
    _nothing_packed(dest)


def test_a_rerun_that_fails_says_the_file_installed_earlier_was_kept(
    made: dict[str, bytes], tmp_path: Path
) -> None:
    src = _local_store(made, tmp_path / "store")
    dest = tmp_path / "dev" / "m.pte"
    first = ptestore.fetch(src, dest, xnnpack_cache=True).xnnpack
    assert first is not None and first["path"] is not None
    record = Path(src).with_name("m.xpwc.json")
    good = json.loads(record.read_bytes())["xnnpack"]
    record.write_bytes(_record(made, {**good, "size": -5}))
    text = _refused(lambda: ptestore.fetch(src, dest, xnnpack_cache=True), StorageError)
    assert text == (
        f"{record}: record xnnpack.size = -5: must be an integer >= 0 or null; {dest} was "
        "already current, its XNNPACK packed-weight file was not replaced (the XNNPACK "
        f"record beside {src} is malformed; the one installed earlier, {first['path']}, was "
        "kept)"
    )
    # a size the file does not have: the download's check fails, the earlier file kept
    record.write_bytes(_record(made, {**good, "size": good["size"] + 1}))
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(src, dest, xnnpack_cache=True)
    assert str(err.value).endswith(
        f"; {dest} was already current, its XNNPACK packed-weight file was not replaced (the "
        f"one installed earlier, {first['path']}, was kept)"
    )
    assert ptestore.xnnpack.find_cache(dest, directory=dest.parent) is not None


def test_a_record_of_another_build_is_said_to_be_the_records(
    made: dict[str, bytes], tmp_path: Path
) -> None:
    build = {"version": "0.1", "git_version": "abc"}
    src = _local_store(made, tmp_path / "store", executorch=build)
    got = ptestore.fetch(src, tmp_path / "dev" / "m.pte", xnnpack_cache=True).xnnpack
    assert got is not None and got["path"] is None
    assert got["reason"].startswith(
        "the record's packed-weight file was made with ExecuTorch 0.1 (abc), this device runs "
    )
    Path(src).with_name("m.xpwc.json").unlink()
    got = ptestore.fetch(src, tmp_path / "dev2" / "m.pte", xnnpack_cache=True).xnnpack
    assert got is not None and got["reason"] == (
        "no XNNPACK record beside the artifact names a packed-weight file of it for this CPU"
    )


@pytest.mark.s3
def test_a_record_on_s3_names_only_s3_objects(
    made: dict[str, bytes], moto_s3: MotoS3, tmp_path: Path
) -> None:
    """A local path (``/etc/passwd``, a real ``.xpwc``), ``file://`` and an ``http://``
    URL (a metadata service's, here a local server's that logs every request) are
    refused before anything is opened or requested; the record's own ``s3://`` file is
    delivered."""
    bucket, client, opts = moto_s3.new_bucket(), moto_s3.client(), moto_s3.storage_options
    for name, data in made.items():
        client.put_object(Bucket=bucket, Key=f"fleet/{name}", Body=data)
    src, rec = f"s3://{bucket}/fleet/m.pte", f"s3://{bucket}/fleet/m.xpwc.json"
    local = tmp_path / "local" / _packed_name(made)
    local.parent.mkdir()
    local.write_bytes(made[_packed_name(made)])
    with redirect_server() as (base, metadata):
        metadata.objects["/latest/meta-data/x.xpwc"] = made[_packed_name(made)]
        named = [
            "/etc/passwd",
            str(local),
            f"file://{local}",
            f"{base}/latest/meta-data/x.xpwc",
        ]
        for i, url in enumerate(named):
            body = _record(made, {"url": url})
            client.put_object(Bucket=bucket, Key="fleet/m.xpwc.json", Body=body)
            dest = tmp_path / f"dev{i}" / "m.pte"
            text = _refused(
                lambda dest=dest: ptestore.fetch(
                    src, dest, storage_options=opts, xnnpack_cache=True
                )
            )
            assert text == (
                f"{rec}: record xnnpack.url = {shown(url)}: {STORE_RULE}; {dest} was published, "
                f"its XNNPACK packed-weight file was not (the XNNPACK record beside {src} is "
                "malformed)"
            )
            _nothing_packed(dest)
        assert metadata.seen == []
    own = f"s3://{bucket}/fleet/{_packed_name(made)}"
    client.put_object(Bucket=bucket, Key="fleet/m.xpwc.json", Body=_record(made, {"url": own}))
    dest = tmp_path / "dev" / "m.pte"
    got = ptestore.fetch(src, dest, storage_options=opts, xnnpack_cache=True).xnnpack
    assert got is not None and got["url"] == own and Path(got["path"]).parent == dest.parent


def _serve(state: ServerState, made: dict[str, bytes], **changed: Any) -> None:
    state.objects.update({f"/{name}": data for name, data in made.items()})
    state.objects["/m.xpwc.json"] = _record(made, changed)


def test_a_record_on_a_server_names_only_its_origin_and_sends_no_header_elsewhere(
    made: dict[str, bytes], tmp_path: Path
) -> None:
    """The user's ``Authorization`` header goes with every request of the server's:
    a record naming a file of another origin, or one the server redirects there, is
    refused and the other origin sees no request; a trusted origin is asked, with it."""
    packed = _packed_name(made)
    with redirect_server() as (home, state), redirect_server() as (other, elsewhere):
        elsewhere.objects[f"/{packed}"] = made[packed]
        src, port = f"{home}/m.pte", home.rsplit(":", 1)[1]
        _serve(state, made, url=f"{other}/{packed}")
        dest = tmp_path / "a" / "m.pte"
        text = _refused(
            lambda: ptestore.fetch(src, dest, storage_options=TOKEN, xnnpack_cache=True)
        )
        assert text == (
            f"{home}/m.xpwc.json: record xnnpack.url = '{other}/{packed}': "
            f"{SERVER_RULE.format(port=port)}; {dest} was published, its XNNPACK "
            f"packed-weight file was not (the XNNPACK record beside {src} is malformed)"
        )
        _nothing_packed(dest)
        # its own URL, redirected to the other origin: refused before anything is sent there
        _serve(state, made, url=f"{home}/moved.xpwc")
        state.redirects["/moved.xpwc"] = f"{other}/{packed}"
        dest = tmp_path / "b" / "m.pte"
        text = _refused(
            lambda: ptestore.fetch(src, dest, storage_options=TOKEN, xnnpack_cache=True)
        )
        assert f"redirected to {other}/{packed}, of origin {other}, not the index's own" in text
        assert text.endswith(
            f"; {dest} was published, its XNNPACK packed-weight file was not (fetch "
            "--xnnpack-cache again resumes its download)"
        )
        _nothing_packed(dest)
        assert elsewhere.seen == []
        assert state.header_values("authorization") == {"Bearer s3cr3t"}
        # trusted: asked, the header with it (what trusting an origin means)
        _serve(state, made, url=f"{other}/{packed}")
        dest = tmp_path / "c" / "m.pte"
        got = ptestore.fetch(
            src, dest, storage_options=TOKEN, xnnpack_cache=True, trusted_origins=[other]
        ).xnnpack
        assert got is not None and Path(got["path"]).parent == dest.parent
        assert elsewhere.header_values("authorization") == {"Bearer s3cr3t"}


def test_a_malformed_trusted_origin_is_refused_before_a_fetch_by_url_reads(
    made: dict[str, bytes], tmp_path: Path
) -> None:
    """It was read only with an index (the record beside an artifact now obeys it)."""
    src = _local_store(made, tmp_path / "store")
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(ConfigurationError) as err:
        ptestore.fetch(src, dest, xnnpack_cache=True, trusted_origins=["https://cdn.example/x"])
    assert str(err.value) == (
        "trusted origin 'https://cdn.example/x' (trusted_origins=, CLI --trust-origin): must "
        "be an origin, http(s)://HOST[:PORT] (e.g. https://cdn.example.com): it has a path "
        "('/x')"
    )
    assert not dest.parent.exists()
