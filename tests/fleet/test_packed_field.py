"""An index's ``xnnpack`` field that a device does not control: its types and form checked
where it is read (``select``), a malformed one for this CPU never reported, and treated
by ``fetch --xnnpack-cache`` and ``ensure --xnnpack-cache`` as a delivery that failed
(``fetch``: an error saying the pair was published; ``ensure``: the file made here, as
docs/device.md says, on the first call and found on the next). Also a url naming a
directory, and the fleet's refusal printed by ``ensure`` escaped. A version 2 index
written here around a real specialized pair; the real runtime makes the files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.fleet_backend import specialized_pair

import ptestore
from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index_entry import entry_for
from ptestore.fleet.packed_field import check_field, runtime_build
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack.identity import cpu_fingerprint, file_sha256

needs_runtime = pytest.mark.skipif(
    runtime_unavailable() is not None, reason=str(runtime_unavailable())
)

HEX = "ab" * 32


def _field(pte: Path, ptd: Path, **changes: Any) -> dict[str, Any]:
    """A packed-weight field for this CPU and runtime, bound to ``pte``/``ptd``, naming
    a file (that is not there), with ``changes``."""
    field: dict[str, Any] = {
        "url": str(pte.with_name("m.xnnpack-" + "0" * 32 + ".xpwc")),
        "size": 3968,
        "sha256": "sha256:" + HEX,
        "entries": 2,
        "cpu": cpu_fingerprint(),
        "executorch": runtime_build() or {"version": "1", "git_version": "g"},
        "artifact_sha256": {
            "pte": "sha256:" + file_sha256(pte),
            "ptd": "sha256:" + file_sha256(ptd),
        },
        "refused": None,
        "chunks_root": None,
        "made": "2026-12-01T08:00:00Z",
    }
    return {**field, **changes}


def _index(tmp: Path, **changes: Any) -> tuple[Path, Path, Path]:
    """A version 2 index whose entry of model ``m`` for device ``a`` is a real pair
    with the packed-weight field :func:`_field` makes: the index, the .pte, the .ptd."""
    pte, ptd = specialized_pair(tmp, "a", 2.0)
    entry = {**entry_for(str(pte), str(ptd), {}, None), "model": "m"}
    entry["xnnpack"] = _field(pte, ptd, **changes)
    index = tmp / "ptestore-index.json"
    index.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [entry]}))
    return index, pte, ptd


#: Malformed fields, and what select says of each (``{leaf}``: the index).
MALFORMED: dict[str, tuple[dict[str, Any], str]] = {
    "artifact_sha256 a list": (
        {"artifact_sha256": [1]},
        "xnnpack.artifact_sha256 = [1]: must be an object",
    ),
    "sha256 not a SHA-256": (
        {"sha256": "md5:1"},
        "xnnpack.sha256 = 'md5:1': must be 'sha256:<64 hex digits>' or null",
    ),
    "size a string": (
        {"size": "3968"},
        "xnnpack.size = '3968': must be an integer or null",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_select_checks_the_field_and_does_not_report_a_malformed_one(
    tmp_path: Path, case: str
) -> None:
    changes, said = MALFORMED[case]
    index, _, _ = _index(tmp_path, **changes)
    choice = ptestore.select(index, "m", "a")
    assert choice.kind == "artifact" and choice.xnnpack is None
    assert choice.xnnpack_error == f"{index}: entry m/a {said}"
    assert choice.to_dict()["xnnpack_error"] == choice.xnnpack_error


def test_check_field_names_each_field() -> None:
    pte_sha = "sha256:" + HEX
    good: dict[str, Any] = {
        "url": "s3://b/m.xnnpack-" + "0" * 32 + ".xpwc",
        "size": 1,
        "sha256": pte_sha,
        "entries": None,
        "cpu": "x86",
        "executorch": {"version": "1", "git_version": "g"},
        "artifact_sha256": {"pte": pte_sha, "ptd": None},
        "refused": None,
        "chunks_root": None,
    }
    assert check_field(good, "idx", "entry m/a") is good
    cases: list[tuple[dict[str, Any], str]] = [
        ({"size": True}, "xnnpack.size = True: must be an integer or null"),
        ({"size": -1}, "xnnpack.size = -1: must be an integer >= 0 or null"),
        ({"cpu": None}, "xnnpack.cpu = None: must be a string"),
        ({"executorch": {"version": 1}}, "xnnpack.executorch.version = 1: must be a string"),
        (
            {"artifact_sha256": {"pte": "x", "ptd": None}},
            "xnnpack.artifact_sha256.pte = 'x': must be 'sha256:<64 hex digits>'",
        ),
        (
            {"chunks_root": pte_sha},
            f"xnnpack.chunks_root = {pte_sha!r}: must be 'sha256-tree:<64 hex digits>' or null",
        ),
        ({"sha256": None}, "xnnpack.sha256 = None: must be given with the url of the file"),
    ]
    for changes, said in cases:
        with pytest.raises(FormatError) as info:
            check_field({**good, **changes}, "idx", "entry m/a")
        assert str(info.value) == f"idx: entry m/a {said}", changes
    with pytest.raises(FormatError) as info:
        check_field([1], "idx", "entry m/a")
    assert str(info.value) == "idx: entry m/a xnnpack = [1]: must be an object or null"


@pytest.mark.interop
@needs_runtime
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_fetch_reports_the_published_pair_when_the_field_is_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """(``artifact_sha256: [1]`` was an AttributeError traceback.)"""
    changes, said = MALFORMED[case]
    index, pte, _ = _index(tmp_path, **changes)
    dest = tmp_path / "dev" / "m.pte"
    argv = ["fetch", str(index), str(dest), "--model", "m", "--device", "a", "--xnnpack-cache"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"ptestore fetch: failed after a partial publish: {index}: entry m/a {said}; {dest} "
        "was published, its XNNPACK packed-weight file was not (the index's entry for it "
        "is malformed)\n"
    )
    assert dest.read_bytes() == pte.read_bytes()  # the pair is published, verified
    assert dest.with_suffix(".ptd").is_file()
    # Again: the pair is already current, left as it was; nothing published this time
    # (it said "failed after a partial publish ... was published").
    ino = dest.stat().st_ino
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"ptestore fetch: failed, nothing published: {index}: entry m/a {said}; {dest} "
        "was already current, its XNNPACK packed-weight file was not (the index's entry for "
        "it is malformed)\n"
    )
    assert dest.stat().st_ino == ino


@pytest.mark.interop
@needs_runtime
def test_fetch_reports_the_published_pair_when_the_url_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(A plain ``error:``, exit 2, that never said the pair was published.)"""
    where = tmp_path / "a-directory"
    where.mkdir()
    index, pte, _ = _index(tmp_path, url=str(where))
    dest = tmp_path / "dev" / "m.pte"
    argv = ["fetch", str(index), str(dest), "--model", "m", "--device", "a", "--xnnpack-cache"]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        f"ptestore fetch: failed after a partial publish: {where}: is a directory, not a "
        f"regular file; refusing to read it; {dest} was published, its XNNPACK packed-weight "
        "file was not"
    )
    assert dest.read_bytes() == pte.read_bytes()


@pytest.mark.interop
@needs_runtime
@pytest.mark.parametrize("case", ["artifact_sha256 a list", "sha256 not a SHA-256", "directory"])
def test_ensure_makes_the_file_here_when_the_index_s_cannot_be_delivered(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    """A malformed field, or one whose url is a directory: the file is made here (it
    was an AttributeError traceback, or exit 2 on every call, a hit included)."""
    where = tmp_path / "a-directory"
    where.mkdir()
    changes = {"url": str(where)} if case == "directory" else MALFORMED[case][0]
    index, _, _ = _index(tmp_path, **changes)
    argv = ["ensure", str(index), "--cache-dir", str(tmp_path / "cache"), "--model", "m"]
    argv += ["--device", "a", "--xnnpack-cache", "--json"]
    caplog.set_level(logging.WARNING, logger="ptestore.device")
    assert main(argv) == 0, capsys.readouterr().err
    made = json.loads(capsys.readouterr().out)
    assert made["xnnpack_from"] == "made" and Path(made["xnnpack_cache"]).is_file()
    said = (
        "is a directory, not a regular file; refusing to read it"
        if case == "directory"
        else MALFORMED[case][1]
    )
    warned = [r.getMessage() for r in caplog.records]
    assert any(
        "the fleet's XNNPACK packed-weight file was not used (" in w
        and said in w
        and w.endswith("); making one here")
        for w in warned
    ), warned
    assert main(argv) == 0  # and a hit: found
    again = json.loads(capsys.readouterr().out)
    assert (again["xnnpack_from"], again["xnnpack_cache"]) == ("found", made["xnnpack_cache"])


@pytest.mark.interop
@needs_runtime
def test_ensure_prints_the_fleet_s_refusal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index's ``refused`` is its words: printed as one printable line (an escape
    sequence or a carriage return reached the terminal raw)."""
    index, _, _ = _index(
        tmp_path, url=None, size=None, sha256=None, refused="crashed\x1b[2J\rall is well"
    )
    argv = ["ensure", str(index), "--cache-dir", str(tmp_path / "cache"), "--model", "m"]
    assert main([*argv, "--device", "a", "--xnnpack-cache"]) == 0
    err = capsys.readouterr().err
    assert (
        "no XNNPACK packed-weight file: crashed\\x1b[2J\\rall is well (refused by the "
        "fleet's runtime)\n"
    ) in err
    assert "\x1b" not in err and "\r" not in err


#: The field a fleet from 4d7a150 to 0550530 wrote (before chunk records): every key but
#: ``chunks_root``; an index migrated to version 3 and a cache manifest keep it so.
BEFORE_CHUNKS: dict[str, Any] = {
    "url": None,
    "size": None,
    "sha256": None,
    "entries": None,
    "cpu": "x",
    "executorch": {"version": "1", "git_version": "g"},
    "artifact_sha256": {"pte": "sha256:" + "0" * 64, "ptd": None},
    "refused": None,
}


def test_a_field_without_chunks_root_reads_it_as_null() -> None:
    """(A ``KeyError: 'chunks_root'`` traceback, from ``select`` and from ``ensure
    --xnnpack-cache`` reading its manifest.) So does any other field that may be null:
    the returned field names each, as null; the one given is not changed."""
    given = dict(BEFORE_CHUNKS)
    checked = check_field(given, "idx", "entry m/a")
    assert checked == {**BEFORE_CHUNKS, "chunks_root": None} and given == BEFORE_CHUNKS
    for name in ("url", "size", "sha256", "entries", "refused"):
        less = {k: v for k, v in BEFORE_CHUNKS.items() if k != name}
        assert check_field(less, "idx", "entry m/a") == {**less, name: None, "chunks_root": None}
    less = {k: v for k, v in BEFORE_CHUNKS.items() if k != "cpu"}  # not optional: refused
    with pytest.raises(FormatError) as info:
        check_field(less, "idx", "entry m/a")
    assert str(info.value) == "idx: entry m/a xnnpack.cpu = None: must be a string"


def test_select_reports_a_field_written_before_chunk_records(tmp_path: Path) -> None:
    index, _, _ = _index(tmp_path)
    data = json.loads(index.read_text())
    del data["entries"][0]["xnnpack"]["chunks_root"]
    index.write_text(json.dumps(data))
    choice = ptestore.select(index, "m", "a")
    assert choice.xnnpack_error is None and choice.xnnpack is not None
    assert choice.xnnpack["chunks_root"] is None and choice.xnnpack["size"] == 3968


@pytest.mark.interop
@needs_runtime
def test_ensure_delivers_a_file_made_before_chunk_records_whole_online_and_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real fleet run's index whose field is as a runner from before chunk records
    wrote it (no ``chunks_root``): ``ensure --xnnpack-cache`` downloads the file whole
    and checks it; so does an entry fetched before, served offline, whose manifest
    records the field so (as ``ensure`` of that time did). Both were a ``KeyError``
    traceback."""
    from support.delta import packed_job, packed_run

    from ptestore.fleet.index import load_index

    mlp = get_fixture("mlp_xnnpack")
    assert mlp.pte_path is not None
    job = packed_job(tmp_path, mlp.pte_path, str(tmp_path / "out"), extra="index_version = 2\n")
    index = Path(packed_run(job, capsys))
    data = json.loads(index.read_text())
    field = data["entries"][0]["xnnpack"]
    del field["chunks_root"]
    index.write_text(json.dumps(data))
    assert load_index(str(index))["entries"][0]["xnnpack"] == field

    def ensure(cache: str, *flags: str) -> dict[str, Any]:
        argv = ["ensure", str(index), "--cache-dir", str(tmp_path / cache), "--model", "m"]
        assert main([*argv, "--device", "phone", "--json", *flags]) == 0
        got: dict[str, Any] = json.loads(capsys.readouterr().out)
        return got

    online = ensure("online", "--xnnpack-cache")
    assert online["xnnpack_from"] == "index"
    assert online["choice"]["xnnpack"] == {**field, "chunks_root": None}
    assert online["choice"]["xnnpack_fetched"] == {"received": field["size"], "from_base": 0}
    assert Path(online["xnnpack_cache"]).read_bytes() == Path(field["url"]).read_bytes()

    before = ensure("offline")  # fetched without the packed-weight file, then
    manifest = Path(before["pte"]).with_name("manifest.json")
    recorded = json.loads(manifest.read_text())
    del recorded["choice"]["xnnpack"]["chunks_root"]  # as that ensure recorded it
    manifest.write_text(json.dumps(recorded))
    index.rename(tmp_path / "moved.json")  # the index cannot be read: served offline
    offline = ensure("offline", "--xnnpack-cache")
    assert offline["choice"]["offline"].startswith("served from the cache offline: ")
    assert offline["xnnpack_from"] == "index"
    assert offline["choice"]["xnnpack_fetched"] == {"received": field["size"], "from_base": 0}
    assert Path(offline["xnnpack_cache"]).read_bytes() == Path(field["url"]).read_bytes()
