"""Hostile index content reaching ``select`` and ``find_entry``: an entry's fields that
select uses, a catalog's depths, counts and classes. Each is a FormatError naming the
object and the field, never a raw Python exception, a silent wrong answer or a walk
past the bottom of the trie."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.errors import ConfigurationError, FormatError
from ptestore.fleet.index import create_index, find_entry, iter_entries, publish_entries
from ptestore.fleet.index_trie import device_bits
from ptestore.fleet.index_v3 import model_segment
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer
from ptestore.writers.versions import read_versioned


def _index(tmp_path: Path) -> tuple[str, Path]:
    url = str(tmp_path / "ptestore-index.json")
    root = create_index(url)
    publish_entries(url, [synthetic_entry("m", "a"), synthetic_entry("m", "b")], {})
    return url, tmp_path / root["layout"]["shards"] / "m" / model_segment("m")


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def _each_entry(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(leaf: dict[str, Any]) -> None:
        for e in leaf["entries"]:
            if value is ...:
                e.pop(field)
            else:
                e[field] = value

    return change


@pytest.mark.parametrize(
    ("field", "value", "device", "message"),
    [
        ("pte", ..., "a", "entry m/a pte = None: must be an object"),
        ("pte", {"url": 5}, "a", "entry m/a pte.url = 5: must be a URL or path"),
        ("ptd", "x", "a", "entry m/a ptd = 'x': must be an object"),
        ("compatibility", "abc", "a", "entry m/a compatibility = 'abc': must be a list of objects"),
        ("compatibility", [5], "a", "entry m/a compatibility = [5]: must be a list of objects"),
        ("source", 3, "zz", "entry m/a source = 3: must be an object"),
        ("source", {"url": None}, "zz", "entry m/a source.url = None: must be a URL or path"),
        ("device_options", "x", "a", "entry m/a device_options = 'x': must be an object"),
        ("device_options", [1, 2], "zz", "entry m/a device_options = [1, 2]: must be an object"),
        (
            "device_options",
            {"memory_mb": float("nan")},
            "a",
            "entry m/a device_options = {'memory_mb': nan}: must be a device's options (device "
            "'a' option 'memory_mb' must be a finite number, got nan (trailers and the index "
            "are JSON, which has no nan or inf))",
        ),
        (
            "device_options",
            {"memory_mb": float("inf")},
            "zz",
            "entry m/a device_options = {'memory_mb': inf}: must be a device's options (device "
            "'a' option 'memory_mb' must be a finite number, got inf (trailers and the index "
            "are JSON, which has no nan or inf))",
        ),
    ],
)
def test_an_entry_field_select_uses_is_checked(
    tmp_path: Path, field: str, value: Any, device: str, message: str
) -> None:
    """Named by the leaf that holds the entry (they named the index's root, which holds
    no entry), whether the entry is the device's own or another's read for its build."""
    url, mdir = _index(tmp_path)
    _edit(mdir / "t.json", _each_entry(field, value))
    profile = DeviceProfile(device, {"soc": "nope"})  # "zz": nothing fits, the source
    with pytest.raises(FormatError) as caught:
        select(url, "m", profile if device == "zz" else device)
    assert str(caught.value) == f"{mdir / 't.json'}: {message}"


def test_an_entry_of_a_version_2_index_is_checked(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    e = synthetic_entry("m", "a")
    e.pop("pte")
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": [e]}))
    with pytest.raises(FormatError) as caught:
        select(url, "m", "a")
    assert str(caught.value) == f"{url}: entry m/a pte = None: must be an object"
    with pytest.raises(FormatError) as caught:
        select({"entries": [e]}, "m", "a")
    assert str(caught.value) == "<index>: entry m/a pte = None: must be an object"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("garbage", "index entries[1] = 'garbage': must be an object with a model and a device"),
        (
            {**synthetic_entry("m", "b"), "model": ["m"]},
            "index entries[1].model = ['m']: must be a string",
        ),
        (
            {**synthetic_entry("m", "b"), "device": 5},
            "index entries[1].device = 5: must be a string",
        ),
        (
            {**synthetic_entry("m", "b"), "device": "b\ud800"},
            "index entries[1].device = 'b\\ud800': must be UTF-8 text (a lone surrogate at "
            "index 1)",
        ),
    ],
)
def test_a_version_2_entry_that_is_not_one_is_refused_not_skipped(
    tmp_path: Path, bad: Any, message: str
) -> None:
    """An entry that is not an object, or whose model or device is not a string, was
    skipped: select answered from the others (the portable source, exit 0), or "index
    has no model". Every reader refuses it, naming the index, its position and field, as
    a version 3 leaf's reader refuses a malformed entry; a publish into it too (it
    raised a TypeError)."""
    url = str(tmp_path / "ptestore-index.json")
    entries = [synthetic_entry("m", "a"), bad, synthetic_entry("n", "c")]
    index = {"format": "ptestore.index", "version": 2, "entries": entries}
    Path(url).write_text(json.dumps(index))
    calls: list[Callable[[], Any]] = [
        lambda: select(url, "m", "b"),
        lambda: select(url, "n", "c"),
        lambda: find_entry(url, "m", "b"),
        lambda: list(iter_entries(url)),
        lambda: publish_entries(url, [synthetic_entry("m", "z")], {}, version=2),
    ]
    for call in calls:
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == f"{url}: {message}"
    with pytest.raises(FormatError) as caught:
        select(index, "m", "b")
    assert str(caught.value) == f"<index>: {message}"
    assert json.loads(Path(url).read_text()) == index  # nothing written


@pytest.mark.parametrize("padding", [0, 70_000])
def test_an_index_version_true_is_refused(tmp_path: Path, padding: int) -> None:
    """``True in (1, 2, 3)`` in Python: an index whose version was ``true`` was read as
    version 1 (past 64 KiB too, from its first bytes)."""
    url = str(tmp_path / "ptestore-index.json")
    entries = [synthetic_entry("m", "a")]
    doc = {"format": "ptestore.index", "version": True, "entries": entries, "pad": "x" * padding}
    Path(url).write_text(json.dumps(doc))
    for call in (lambda: select(url, "m", "a"), lambda: find_entry(url, "m", "a")):
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == f"{url}: index version = True: must be 1, 2 or 3"


def test_a_model_a_version_2_index_lacks_is_named_with_the_index(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    entries = [synthetic_entry("m", "a")]
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    with pytest.raises(ConfigurationError) as caught:
        select(url, "nope", "a")
    assert str(caught.value) == f"{url}: index has no model 'nope' (models: m)"
    with pytest.raises(ConfigurationError) as caught:
        select({"entries": entries}, "nope", "a")
    assert str(caught.value) == "<index>: index has no model 'nope' (models: m)"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"leaves": {"300": 1}}, "index catalog leaves = '300': must be a depth in 0..256"),
        ({"leaves": {"-1": 1}}, "index catalog leaves = '-1': must be a depth in 0..256"),
        ({"leaves": {"0": -1}}, "index catalog leaves.0 = -1: must be an int >= 0"),
        ({"leaves": {"0": True}}, "index catalog leaves.0 = True: must be an int >= 0"),
        ({"leaves": [0]}, "index catalog leaves = [0]: must be an object of depth: count"),
        ({"classes": {}}, "index catalog classes = {}: must be a list of classes"),
        ({"classes": [5]}, "index catalog classes[0] = 5: must be an object"),
        (
            {"classes": [{"compatibility": [7], "devices": ["a"], "more": False}]},
            "index catalog classes[0].compatibility = [7]: must be a list of objects",
        ),
        (
            {"classes": [{"compatibility": [], "devices": [1], "more": False}]},
            "index catalog classes[0].devices = [1]: must be a list of strings",
        ),
        (
            {"classes": [{"compatibility": [], "devices": ["a"], "more": "yes"}]},
            "index catalog classes[0].more = 'yes': must be a bool",
        ),
        (
            {"classes": [{"compatibility": [], "devices": [f"d{i}" for i in range(9)]}]},
            "index catalog classes[0].devices (names) = 9: must be at most 8 (layout listed)",
        ),
        (
            {"classes": [{"compatibility": [], "devices": ["\ud800"], "more": False}]},
            "index catalog classes[0].devices[0] = '\\ud800': must be UTF-8 text (a lone "
            "surrogate at index 0)",
        ),
    ],
)
def test_a_catalog_is_checked(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    url, mdir = _index(tmp_path)
    _edit(mdir / "catalog.json", lambda v: v.update(change))
    for call in (lambda: select(url, "m", "a"), lambda: find_entry(url, "m", "a")):
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == f"{mdir / 'catalog.json'}: {message}"


def test_a_catalog_too_deep_in_memory_is_refused_not_an_absent_entry() -> None:
    """On a store without a name-length limit a depth past 256 made the entry vanish."""
    url = "memory://hostile-depths/ptestore-index.json"
    root = create_index(url)
    publish_entries(url, [synthetic_entry("m", "a")], {})
    cat = f"memory://hostile-depths/{root['layout']['shards']}/m/{model_segment('m')}/catalog.json"
    value = json.loads(read_versioned(cat).data)
    _put(cat, {**value, "leaves": {"300": 1}})
    with pytest.raises(FormatError) as caught:
        find_entry(url, "m", "a")
    assert str(caught.value) == f"{cat}: index catalog leaves = '300': must be a depth in 0..256"


def _put(url: str, value: dict[str, Any]) -> None:
    w = open_writer(url)
    w.write(json.dumps(value).encode(), 0)
    w.publish("overwrite")


def test_a_split_marker_at_the_last_depth_is_refused() -> None:
    """A device hash has 256 bits: a split node at depth 256 has nothing below it (in
    memory: a local file name that long is refused by the file system first)."""
    url = "memory://hostile-split/ptestore-index.json"
    root = create_index(url)
    publish_entries(url, [synthetic_entry("m", "a")], {})
    mdir = f"memory://hostile-split/{root['layout']['shards']}/m/{model_segment('m')}"
    bits = device_bits("a")
    for depth in range(257):
        prefix = bits[:depth]
        marker = {"format": "ptestore.index-shard", "version": 3, "model": "m"}
        _put(f"{mdir}/t{prefix}.json", {**marker, "prefix": prefix, "state": "split"})
    value = json.loads(read_versioned(f"{mdir}/catalog.json").data)
    _put(f"{mdir}/catalog.json", {**value, "leaves": {"256": 1}})
    with pytest.raises(FormatError) as caught:
        find_entry(url, "m", "a")
    assert str(caught.value) == (
        f"{mdir}/t{bits}.json: index shard state = 'split': must be a leaf at depth 256"
    )


_DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("what", ["root", "catalog", "leaf", "large root"])
def test_json_nested_too_deeply_is_a_format_error(tmp_path: Path, what: str) -> None:
    """``[[[...]]]`` escaped as a RecursionError from every reader and writer. At the
    root URL, text past a version 3 root's bound whose first 64 KiB are no version 1/2
    index is refused from them, unread further."""
    url, mdir = _index(tmp_path)
    target = {"catalog": mdir / "catalog.json", "leaf": mdir / "t.json"}.get(what, Path(url))
    deep = b"[" * 30_000 + b"]" * 30_000 if what == "root" else _DEEP
    target.write_bytes(deep)
    calls: list[Callable[[], object]] = [
        lambda: select(url, "m", "a"),
        lambda: find_entry(url, "m", "a"),
        lambda: publish_entries(url, [synthetic_entry("m", "c")], {}),
    ]
    for call in calls:
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == (
            f"{target}: index size = 200000: must be at most 65536 bytes (a version 3 root; "
            "its first 65536 bytes show no version 1 or 2 index, neither a version nor "
            "entries: not read further)"
            if what == "large root"
            else f"{target}: index (nesting depth) = {len(deep) // 2}: must be <= 64 levels "
            "of arrays and objects"
        )


def test_json_nested_past_the_bound_but_readable_is_refused(tmp_path: Path) -> None:
    url, mdir = _index(tmp_path)
    _edit(mdir / "t.json", _each_entry("device_options", json.loads("[" * 70 + "]" * 70)))
    with pytest.raises(FormatError) as caught:
        select(url, "m", "a")
    assert str(caught.value) == (
        f"{mdir / 't.json'}: index (nesting depth) = 73: must be <= 64 levels of arrays and objects"
    )


def test_a_catalog_nested_too_deeply_is_repaired(tmp_path: Path) -> None:
    from ptestore.fleet.index_check import check_index

    url, mdir = _index(tmp_path)
    (mdir / "catalog.json").write_bytes(_DEEP)
    report = check_index(url, None, repair=True)
    assert report.problems == {
        "m": [
            f"damaged catalog: {mdir / 'catalog.json'}: index (nesting depth) = 100000: must "
            "be <= 64 levels of arrays and objects"
        ]
    }
    assert select(url, "m", "a").kind == "artifact"


def _pad(path: Path, size: int, text: str) -> None:
    """``path``'s object ``text`` padded (a field of its own) to ``size`` bytes."""
    head = text.rstrip()[:-1] + ',"padding":"'
    path.write_text(head + "x" * (size - len(head) - 2) + '"}')
    assert path.stat().st_size == size


@pytest.mark.parametrize(
    ("what", "size", "message"),
    [
        (
            "root",
            (64 << 10) + 1,
            "index size = 65537: must be at most 65536 bytes (a version 3 root: not read past "
            "its first 65536 bytes)",
        ),
        (
            "catalog",
            (16 << 20) + 1,
            "index catalog size = 16777217: must be at most 16777216 bytes (not read)",
        ),
        (
            "leaf",
            16384 + (4 << 20) + 4096 + 1,
            "index shard size = 4214785: must be at most 4214784 bytes (not read)",
        ),
    ],
)
def test_an_object_past_its_bound_is_refused(
    tmp_path: Path, what: str, size: int, message: str
) -> None:
    """Each object was read whole, however large, before anything was checked."""
    url, mdir = _index(tmp_path)
    target = {"root": Path(url), "catalog": mdir / "catalog.json", "leaf": mdir / "t.json"}[what]
    text = target.read_text()
    _pad(target, size - 1, text)
    assert select(url, "m", "a").kind == "artifact"  # at its bound: read
    _pad(target, size, text)
    for call in (lambda: select(url, "m", "a"), lambda: find_entry(url, "m", "a")):
        with pytest.raises(FormatError) as caught:
            call()
        assert str(caught.value) == f"{target}: {message}"


def test_an_object_past_its_bound_in_memory_is_refused() -> None:
    url = "memory://hostile-size/ptestore-index.json"
    root = create_index(url)
    publish_entries(url, [synthetic_entry("m", "a")], {})
    cat = f"memory://hostile-size/{root['layout']['shards']}/m/{model_segment('m')}/catalog.json"
    value = json.loads(read_versioned(cat).data)
    _put(cat, {**value, "padding": "x" * (16 << 20)})
    wanted = r"catalog.json: index catalog size = \d+: must be at most 16777216 bytes \(not read\)$"
    with pytest.raises(FormatError, match=wanted):
        find_entry(url, "m", "a")


def test_a_catalog_past_its_bound_is_repaired(tmp_path: Path) -> None:
    from ptestore.fleet.index_check import check_index

    url, mdir = _index(tmp_path)
    _pad(mdir / "catalog.json", (16 << 20) + 1, (mdir / "catalog.json").read_text())
    check_index(url, None, repair=True)
    assert (mdir / "catalog.json").stat().st_size < 4096
    assert select(url, "m", "a").kind == "artifact"


def test_a_version_2_index_past_the_version_3_bounds_is_read(tmp_path: Path) -> None:
    """A version 2 index holds every entry in its one object: far past a version 3
    root's or catalog's bound, it is still read (up to 1 GiB)."""
    url = str(tmp_path / "ptestore-index.json")
    entries = [synthetic_entry("m", f"d{i:04d}") for i in range(300)]
    Path(url).write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    assert Path(url).stat().st_size > 64 << 10
    assert select(url, "m", "d0007").kind == "artifact"


#: ``ptestore ARGV`` in a fresh interpreter whose address space is limited to 1 GiB.
_LIMITED = """\
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from ptestore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _limited(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(ptestore.__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_version_2_index_is_read_in_the_memory_its_size_needs(tmp_path: Path) -> None:
    """A version 2 index was read into a buffer of its bound (1 GiB), whatever its size:
    a 140 KB index made ``select`` fail with a MemoryError traceback under a 1 GiB
    address-space limit (a sandbox, ``ulimit -v``, a 32-bit device)."""
    url = tmp_path / "ptestore-index.json"
    entries = [synthetic_entry(f"m{i % 2}", f"d{i:03d}") for i in range(100)]
    url.write_text(json.dumps({"format": "ptestore.index", "version": 2, "entries": entries}))
    assert 100_000 < url.stat().st_size < 200_000
    done = _limited(["select", str(url), "--model", "m0", "--device", "d000"], tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("artifact: s3://fleet/models/d000/m0.pte + ")


def test_a_version_2_index_larger_than_memory_allows_is_one_error_line(tmp_path: Path) -> None:
    """An index within its bound (1 GiB) that the process cannot hold is a one-line
    error, exit 1 (rerunning with more memory may succeed), never a traceback. The file
    is sparse: it takes no disk."""
    url = tmp_path / "ptestore-index.json"
    with url.open("wb") as f:
        f.write(b'{"format": "ptestore.index", "version": 2, "entries": [')
        f.truncate((1 << 30) - 1)
    done = _limited(["select", str(url), "--model", "m", "--device", "d"], tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "ptestore select: error: out of memory: an allocation failed (the process's "
        "address-space limit, ulimit -v, or the machine's memory); rerun with more memory\n"
    )
    done = _limited(["select", str(url), "--model", "m", "--device", "d", "--json"], tmp_path)
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert (error["type"], error["exit_code"]) == ("MemoryError", 1)
    assert error["message"].startswith("out of memory: an allocation failed")


def test_an_entry_too_large_to_publish_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ptestore-index.json")
    big = synthetic_entry("m", "a")
    big["device_options"] = {"blob": "x" * (2 << 20)}
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [big], {})
    assert re.fullmatch(
        rf"{re.escape(url)}: index entry m/a size = \d+: must be at most 2097152 bytes",
        str(caught.value),
    )


def test_an_entry_nested_too_deep_to_read_is_refused_and_its_leaf_kept(tmp_path: Path) -> None:
    """One such entry was written, and every reader refused its leaf after: every
    device of the model (the leaf and its ``entries`` array are two more levels)."""
    url = str(tmp_path / "ptestore-index.json")
    publish_entries(url, [synthetic_entry("m", "ok")], {})
    deep = synthetic_entry("m", "deep")
    nested: dict[str, Any] = {}
    deep["job"] = nested
    for _ in range(60):  # the entry: 62 levels, the most a leaf's 64 hold
        nested["a"] = {}
        nested = nested["a"]
    publish_entries(url, [deep], {})
    assert select(url, "m", "deep").kind == "artifact"
    nested["a"] = {}  # 63
    deeper = {**deep, "device": "deeper"}
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [deeper], {})
    assert str(caught.value) == (
        f"{url}: index entry m/deeper (nesting depth) = 63: must be at most 62 levels of "
        "arrays and objects (the index's objects nest at most 64)"
    )
    assert select(url, "m", "ok").kind == "artifact"
    assert select(url, "m", "deep").kind == "artifact"


def test_a_leaf_past_its_bound_on_s3_is_refused_unread(s3_server: S3TestServer) -> None:
    """On S3 the object's Content-Length decides: its body is never downloaded."""
    bucket = s3_server.new_bucket()
    opts: dict[str, Any] = dict(s3_server.storage_options)
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    root = create_index(url, storage_options=opts)
    publish_entries(url, [synthetic_entry("m", "a")], opts)
    key = f"fleet/{root['layout']['shards']}/m/{model_segment('m')}/t.json"
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key=key, Body=b"x" * (16384 + (4 << 20) + 4097))
    with pytest.raises(FormatError) as caught:
        select(url, "m", "a", storage_options=opts)
    assert str(caught.value) == (
        f"s3://{bucket}/{key}: index shard size = 4214785: must be at most 4214784 bytes (not read)"
    )


def test_a_catalog_whose_stand_ins_all_fail_points_to_the_repair(tmp_path: Path) -> None:
    """Every listed name missing from the leaves said "changed while it was read; run
    again", which a catalog that disagrees with its leaves never stops doing. A listed
    device its leaf does not hold is refused (the leaf may have lost it), pointing to
    check-index; stand-ins still there that changed since the catalog was read (all
    retired) still say "run again"."""
    url, mdir = _index(tmp_path)
    catalog = (mdir / "catalog.json").read_text()
    _edit(mdir / "catalog.json", lambda v: [c.update(devices=["x", "y"]) for c in v["classes"]])
    with pytest.raises(FormatError) as caught:
        select(url, "m", "zz")
    assert str(caught.value) == (
        f"{url}: index shards = '{mdir.parents[1].name}': must be every node its catalogs "
        f"and split nodes name ({mdir}/catalog.json: index catalog classes[0].devices[0] = "
        f"'x': must be a device whose entry is in one of the model's leaves (its leaf is "
        f"{mdir}/t.json: it does not hold it: the catalog disagrees with its leaves, or the "
        "leaf lost it (a writer updates the leaves before the catalog, and never removes an "
        "entry)); the entry of model 'm' for device 'x' may be lost with it, so it is not "
        f"answered as none (the portable source): `ptestore fleet check-index {url}` says "
        "what is missing and what --repair can rebuild)"
    )
    (mdir / "catalog.json").write_text(catalog)
    _edit(mdir / "t.json", _each_entry("retired", {"reason": "gone"}))
    with pytest.raises(ConfigurationError) as caught:
        select(url, "m", "zz")
    assert str(caught.value) == (
        f"{url}: no entry of model 'm' the catalog lists is in its leaves as listed: changed "
        "while it was read, or the catalog disagrees with its leaves; run again, and if it "
        f"persists, repair it: ptestore fleet check-index {url} --repair"
    )


def test_a_leaf_entry_named_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    """ "\\ud800" is valid JSON but no UTF-8: hashing it escaped as UnicodeEncodeError."""
    url, mdir = _index(tmp_path)
    _edit(mdir / "t.json", lambda v: v["entries"][1].update(device="b\ud800"))
    with pytest.raises(FormatError) as caught:
        select(url, "m", "a")
    assert str(caught.value) == (
        f"{mdir / 't.json'}: index shard entry device = 'b\\ud800': must be UTF-8 text (a "
        "lone surrogate at index 1)"
    )


@pytest.mark.parametrize("field", ["model", "device"])
def test_a_version_2_entry_named_with_a_lone_surrogate_is_refused(
    tmp_path: Path, field: str
) -> None:
    url = str(tmp_path / "ptestore-index.json")
    bad = synthetic_entry("m", "a")
    bad[field] = "x\ud800"
    v2 = {"format": "ptestore.index", "version": 2, "entries": [synthetic_entry("m", "b"), bad]}
    Path(url).write_text(json.dumps(v2))
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", "c")], {})
    assert str(caught.value) == (
        f"{url}: index entries[1].{field} = 'x\\ud800': must be UTF-8 text (a lone surrogate "
        "at index 1)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ptestore-index.json"]
    fresh = str(tmp_path / "new" / "ptestore-index.json")
    with pytest.raises(FormatError) as caught:
        publish_entries(fresh, [bad], {})
    assert str(caught.value) == (
        f"{fresh}: index entry {field} = 'x\\ud800': must be UTF-8 text (a lone surrogate at "
        "index 1)"
    )


def test_a_catalog_depth_spread_is_read_a_bounded_width_at_once(tmp_path: Path) -> None:
    """``{"0": 1, "200": 1}`` made a device request 201 depths at once (203 requests).
    Not refused: concurrent splits can leave a sound index's counts short of its depths."""
    url, mdir = _index(tmp_path)
    _edit(mdir / "catalog.json", lambda v: v.update(leaves={"0": 1, "200": 1}))
    choice = select(url, "m", "a")
    assert choice.kind == "artifact" and choice.made_for == "a"
    assert choice.index_read is not None and choice.index_read["requests"] <= 12
