"""The manifest of a cache entry: one :class:`~ptestore.device.manifest.Manifest` record,
filled alike by a specialized copy, an in-place run and a download from an index, and
published atomically (``put_bytes``) with the cache's disk-full error."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.device.layout import CacheLayout, read_manifest
from ptestore.device.manifest import PTE_NAME, Manifest, file_records
from ptestore.errors import StorageError

SPEC = "support.counting_backend:Counting=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0})
COMMON = {
    "format",
    "version",
    "key",
    "source",
    "ptd_source",
    "fingerprint",
    "files",
    "specialized",
    "in_place",
    "provenance",
}


@pytest.fixture
def src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    dst = tmp_path / "model.pte"
    shutil.copyfile(fx.pte_path, dst)
    return dst


def _manifest(cache: Path, key: str) -> dict[str, Any]:
    m = read_manifest(CacheLayout(cache).manifest(key))
    assert m is not None
    return m


def test_a_copy_and_an_in_place_entry_fill_the_same_record(tmp_path: Path, src: Path) -> None:
    cache = tmp_path / "cache"
    copy = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    m = _manifest(cache, copy.key)
    assert set(m) == COMMON | {"ctime_ns"}  # a local source's, beside the fingerprint
    assert m["ctime_ns"] == {"source": os.stat(src).st_ctime_ns}
    assert (m["key"], m["source"], m["in_place"]) == (copy.key, str(src), False)
    st = os.stat(copy.pte)
    assert m["files"] == {
        "pte": {
            "name": PTE_NAME,
            "size": st.st_size,
            "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
        }
    }
    assert m["provenance"] == (copy.provenance.to_dict() if copy.provenance else None)
    assert m["fingerprint"]["device"] == [DEVICE.name, DEVICE.digest()]

    own = tmp_path / "own.pte"
    shutil.copyfile(src, own)
    rewritten = ptestore.ensure(own, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
    m = _manifest(cache, rewritten.key)
    assert set(m) == COMMON | {"ctime_ns"}
    assert m["ctime_ns"] == {"source": os.stat(own).st_ctime_ns}
    assert (m["source"], m["in_place"], m["files"], m["ptd_source"]) == (
        str(own),
        True,
        {},
        None,
    )
    assert m["fingerprint"]["source"]["ino"] == os.stat(own).st_ino
    # Both are hits now, read back from the same record.
    assert not ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE).created
    again = ptestore.ensure(own, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True)
    assert not again.created and again.in_place


def test_an_index_entry_adds_only_where_it_came_from(tmp_path: Path) -> None:
    (tmp_path / "model.pte").write_bytes(b"x")
    m = Manifest.of(
        key="k" * 32,
        source="s3://b/job/phone/model.pte",
        index=str(tmp_path / "ptestore-index.json"),
        fingerprint={"pte": ("tuple", "as json")},
        files=file_records(str(tmp_path), {"pte": "model.pte"}),
        specialized=True,
        provenance=None,
        choice={"kind": "artifact", "reason": ("exact",)},
    ).to_dict()
    assert set(m) == COMMON | {"index", "choice"}
    assert m["fingerprint"] == {"pte": ["tuple", "as json"]}  # stored as JSON reads it back
    assert m["choice"] == {"kind": "artifact", "reason": ["exact"]}
    assert m["files"]["pte"]["size"] == 1


def test_a_full_disk_while_publishing_the_manifest_is_the_caches_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = CacheLayout(tmp_path / "cache")
    layout.create()
    os.makedirs(layout.entry_dir("k" * 32))
    manifest = Manifest.of(
        key="k" * 32,
        source="/src/model.pte",
        fingerprint={},
        files={},
        specialized=False,
        provenance=None,
    )
    size = len(json.dumps(manifest.to_dict(), indent=1, sort_keys=True).encode())

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StorageError) as err:
        manifest.publish(layout, "/src/model.pte")
    msg = str(err.value)
    assert re.fullmatch(
        re.escape(
            f"{layout.root}: no space left on the file system for the manifest of the entry "
            f"of /src/model.pte ({size} bytes; "
        )
        + r"\d+"  # measured when it failed: this file system is shared (the test's tmp)
        + re.escape(
            " bytes were free when it failed); the cache and the source are unchanged. Free "
            "space (`ptestore cache prune --max-bytes N`) or specialize in place "
            "(--in-place): "
        )
        + ".*cannot write: No space left on device",
        msg,
    ), msg
    assert os.listdir(layout.entry_dir("k" * 32)) == []


def test_the_names_ensuring_had_before_the_split_still_work(tmp_path: Path) -> None:
    from ptestore.device import ensuring

    assert ensuring.spec_text(" passthrough ") == "passthrough"
    assert (ensuring.PTE_NAME, ensuring.PTD_NAME) == ("model.pte", "model.ptd")
    assert "no space left" in str(ensuring.disk_full_error(str(tmp_path), "s", 1, OSError()))
    layout = CacheLayout(tmp_path / "cache")
    layout.create()
    os.makedirs(layout.entry_dir("k" * 32))
    record = Manifest.of(
        key="k" * 32, source="/s", fingerprint={}, files={}, specialized=True, provenance=None
    ).to_dict()
    ensuring.write_manifest(layout, "k" * 32, record, "/s")
    assert read_manifest(layout.manifest("k" * 32)) == record
