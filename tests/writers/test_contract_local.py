"""The writer contract on LocalFileWriter."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ptestore.testing.writer_contract import WriterContract
from ptestore.writers import DataWriter, LocalFileWriter, open_writer
from ptestore.writers.local import TEMP_NAME_RE


class TestLocalContract(WriterContract):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.counter = 0

    def new_dest(self) -> str:
        self.counter += 1
        d = self.root / f"d{self.counter}"
        d.mkdir()
        return str(d / "model.pte")

    def make_writer(self, dest: str) -> DataWriter:
        w = open_writer(dest)
        assert isinstance(w, LocalFileWriter)
        return w

    def get(self, dest: str) -> bytes | None:
        try:
            with open(dest, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, dest: str, data: bytes) -> None:
        with open(dest, "wb") as f:
            f.write(data)

    def leftovers(self, dest: str) -> list[str]:
        d = os.path.dirname(dest)
        return sorted(n for n in os.listdir(d) if TEMP_NAME_RE.match(n))

    def at_commit_operation(
        self, writer: DataWriter, action: Callable[[], None]
    ) -> contextlib.AbstractContextManager[None]:
        """Run ``action`` inside ``writer``'s own ``link``/``rename`` system call (just
        before it), after every check the writer made."""
        assert isinstance(writer, LocalFileWriter)
        target = writer.path
        fired: list[bool] = []

        def wrap(real: Callable[..., None]) -> Callable[..., None]:
            def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                if not fired and os.fspath(dst) == target and os.fspath(src) != target:
                    fired.append(True)
                    action()  # the other writer's own call passes straight through
                real(src, dst, *args, **kwargs)

            return call

        @contextlib.contextmanager
        def patched() -> Iterator[None]:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(os, "link", wrap(os.link))
                mp.setattr(os, "replace", wrap(os.replace))
                mp.setattr(os, "rename", wrap(os.rename))
                yield

        return patched()


class TestFileUrlContract(TestLocalContract):
    model_examples = 5

    def make_writer(self, dest: str) -> DataWriter:
        w = open_writer("file://" + dest)
        assert isinstance(w, LocalFileWriter)
        return w
