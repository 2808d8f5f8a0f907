"""A damaged or planted record beside a packed-weight file (JSON nested too deeply, a
FIFO, a file too large, a NUL in a remembered path) and a missing artifact: each a
:class:`~ptestore.errors.PteStoreError` naming the file, or a file made again, never a
raw Python exception or a reader blocked for ever."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ptestore.errors import FormatError, ObjectNotFound
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack.record import MAX_RECORD_BYTES, read_record

MLP = Path(__file__).parents[1] / "fixtures" / "mlp_xnnpack.pte"
needs_runtime = pytest.mark.skipif(
    runtime_unavailable() is not None, reason=str(runtime_unavailable())
)


def test_a_record_nested_too_deeply_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "xnnpack-0.xpwc.json"
    path.write_text("[" * 200_000)
    with pytest.raises(FormatError) as info:
        read_record(path)
    assert str(info.value).startswith(f"{path}: record")
    assert "RecursionError" in str(info.value)


def test_a_fifo_or_an_oversized_record_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "xnnpack-1.xpwc.json"
    os.mkfifo(fifo)  # no writer: a blocking open would never return
    with pytest.raises(FormatError) as info:
        read_record(fifo)
    assert str(info.value).startswith(f"{fifo}: record")
    assert "prw-" in str(info.value) and "a regular file" in str(info.value)
    big = tmp_path / "xnnpack-2.xpwc.json"
    big.write_text(json.dumps({"pad": "x" * MAX_RECORD_BYTES}))
    with pytest.raises(FormatError) as info:
        read_record(big)
    assert f"more than {MAX_RECORD_BYTES} bytes" in str(info.value)
    assert f"at most {MAX_RECORD_BYTES} bytes" in str(info.value)
    link = tmp_path / "xnnpack-3.xpwc.json"
    link.symlink_to(big)
    with pytest.raises(FormatError, match="a symbolic link"):
        read_record(link)


@pytest.mark.interop
@needs_runtime
def test_damaged_records_beside_a_made_file(tmp_path: Path) -> None:
    from ptestore.xnnpack import find_cache, make_cache, verify_cache

    made = make_cache(MLP, directory=tmp_path / "made")
    d = tmp_path / "d"
    d.mkdir()
    for p in (made.path, made.record_path):
        shutil.copy2(p, d / p.name)
    record = d / made.record_path.name
    good = json.loads(record.read_text())

    # a NUL in a remembered path: the file is still found and verified
    os.chmod(record, 0o644)
    record.write_text(json.dumps({**good, "artifacts": {"/x\0y": {"sha256": "0" * 64}}}))
    assert find_cache(MLP, directory=d, full=False) is not None
    assert verify_cache(d / made.path.name, pte=MLP, full=False).sha256 == made.sha256

    # nested too deeply: not found, made again, verify says what is wrong
    record.write_text("[" * 200_000)
    with pytest.raises(FormatError, match="RecursionError"):
        verify_cache(d / made.path.name, pte=MLP)
    assert find_cache(MLP, directory=d) is None
    assert make_cache(MLP, directory=d).made

    # a FIFO named like a record: the quick lookup passes it by
    os.mkfifo(d / "xnnpack-00000000000000000000000000000000.xpwc.json")
    assert find_cache(MLP, directory=d, full=False) is not None


@pytest.mark.interop
@needs_runtime
def test_a_missing_artifact_is_object_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptestore.xnnpack import make_cache
    from ptestore.xnnpack.__main__ import main

    missing = tmp_path / "nope.pte"
    with pytest.raises(ObjectNotFound) as info:
        make_cache(missing, directory=tmp_path / "d")
    assert str(info.value) == f"{missing}: no such file (the artifact)"
    assert main(["make", str(missing), "--dir", str(tmp_path / "d")]) == 1
    assert capsys.readouterr().err == f"error: {missing}: no such file (the artifact)\n"


@pytest.mark.interop
@needs_runtime
def test_a_packed_weight_file_that_is_a_link_is_refused_everywhere(tmp_path: Path) -> None:
    """verify_cache and find_cache followed a link that load() refuses (it opens without
    following): load() then said the file was "removed, replaced or changed while load()
    verified it", which it was not. Each now says it is a link."""
    from ptestore.errors import IntegrityError
    from ptestore.xnnpack import find_cache, load, make_cache, verify_cache

    made = make_cache(MLP, directory=tmp_path / "made")
    d = tmp_path / "linked"
    d.mkdir()
    link = d / made.path.name
    link.symlink_to(made.path)
    shutil.copy2(made.record_path, d / made.record_path.name)
    message = (
        f"{link}: a symbolic link; a packed-weight file is handed out only as the file "
        "itself (give its real path)"
    )
    for check in (
        lambda: verify_cache(link, pte=MLP),
        lambda: verify_cache(link, pte=MLP, full=False),
        lambda: load(MLP, cache=link),  # refused before the runtime is loaded
    ):
        with pytest.raises(IntegrityError) as info:
            check()
        assert str(info.value) == message
    assert find_cache(MLP, directory=d) is None
    assert find_cache(MLP, directory=d, full=False) is None
