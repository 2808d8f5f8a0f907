"""The writer contract on FsspecWriter, over fsspec's ``dir://`` wrapping local files.

The generic writer's overwrite and create are only as atomic/exclusive as the
filesystem's ``put_file`` (a plain copy here): its guarantees say so and the contract
skips the race tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptestore.errors import ConfigurationError, StorageError
from ptestore.testing.writer_contract import WriterContract
from ptestore.writers import DataWriter, FsspecWriter, open_writer


class TestGenericContract(WriterContract):
    model_examples = 10

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.spool = tmp_path / "spool"
        self.root.mkdir()
        self.spool.mkdir()
        self.counter = 0

    def new_dest(self) -> str:
        self.counter += 1
        (self.root / f"d{self.counter}").mkdir()
        return f"dir://d{self.counter}/model.pte"

    def make_writer(self, dest: str) -> DataWriter:
        w = open_writer(
            dest, path=str(self.root), target_protocol="file", spool_dir=str(self.spool)
        )
        assert isinstance(w, FsspecWriter)
        return w

    def _local(self, dest: str) -> Path:
        return self.root / dest.removeprefix("dir://")

    def get(self, dest: str) -> bytes | None:
        try:
            return self._local(dest).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, dest: str, data: bytes) -> None:
        self._local(dest).write_bytes(data)

    def leftovers(self, dest: str) -> list[str]:
        return sorted(os.listdir(self.spool))


def test_unknown_protocol() -> None:
    with pytest.raises(ConfigurationError, match=r"nosuch://x: cannot open the filesystem"):
        open_writer("nosuch://x")


def test_upload_failure_is_reported(tmp_path: Path) -> None:
    w = open_writer("dir://missing-dir/m.pte", path=str(tmp_path), target_protocol="file")
    w.write(b"x", 0)
    with pytest.raises(StorageError, match=r"dir://missing-dir/m.pte: upload at publish failed"):
        w.publish()
