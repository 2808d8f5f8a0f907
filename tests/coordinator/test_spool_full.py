"""A full spool disk says where: the spool's directory, that it is the replacement
spool, and how to put it elsewhere (``spool_dir``, ``--spool-dir``, ``TMPDIR``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.fixtures import copy_pte, get_fixture
from support.large import ReplaceKey
from support.smallfs import tmpfs

import ptestore
from ptestore.errors import StorageError

FX = get_fixture("mlp_xnnpack")
assert FX.doubled is not None and FX.doubled.key is not None


@pytest.mark.parametrize("how", ["spool_dir", "TMPDIR"])
def test_a_full_spool_names_its_directory_and_how_to_move_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    import tempfile

    src = copy_pte(tmp_path / "model.pte")
    grow = ReplaceKey("XnnpackBackend", FX.doubled.key, extra=2 << 20)  # 2 MiB more
    with tmpfs(tmp_path / "spool", "1m") as spool:
        kwargs: dict[str, str] = {}
        if how == "spool_dir":
            kwargs["spool_dir"] = str(spool)
        else:  # the default for an output that is no local file: the temp dir
            monkeypatch.setenv("TMPDIR", str(spool))
            monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
            kwargs["spool_dir"] = None  # type: ignore[assignment]
        with pytest.raises(StorageError) as err:
            ptestore.specialize(src, "memory://out/model.pte", backends=[grow], **kwargs)
        n = len(grow.replacement)
        assert str(err.value) == (
            f"cannot spool {n} replacement bytes in {spool} (the replacement spool, where "
            "replaced bytes wait until the layout is known; spool_dir=, --spool-dir DIR, or "
            "TMPDIR put it on another file system): No space left on device"
        )
        assert os.listdir(spool) == []
