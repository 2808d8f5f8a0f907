"""An in-place journal that is not what a run commits is never applied: a plan whose
fields are not a run's (sizes, writes outside the file or the payload, an identifier
that is not 4 bytes, not JSON), re-committed so its commit record matches; a FIFO, a
directory or a link at the journal's path (refused without blocking); and a committed
journal beside a rewrite of its file (the same inode, size and first bytes, another
byte in a chunk the plan does not touch)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.large import ReplaceKey, inflate

import ptestore
import ptestore.coordinator.inplace as inplace_module
from ptestore.errors import StorageError
from ptestore.journal import COMMIT_RECORD, COMMIT_V2, FOOTER, MAGIC, check_journal, journal_path

FX = get_fixture("mlp_xnnpack")
SPEC = "support.doubling_backend:Doubling=mlp_xnnpack"
assert FX.pte_path is not None and FX.doubled is not None and FX.doubled.key is not None


class _Crash(Exception):
    pass


def _committed(path: Path, backends: list[Any] | None = None) -> Path:
    """``path`` specialized in place up to its journal's commit (then "killed")."""

    def crash(*args: Any, **kwargs: Any) -> None:
        raise _Crash

    with pytest.MonkeyPatch.context() as m:
        m.setattr(inplace_module, "apply_uninterrupted", crash)
        with pytest.raises(_Crash):
            ptestore.specialize(
                path, path, backends=backends or [SPEC], in_place=True, provenance=False
            )
    journal = Path(journal_path(str(path)))
    assert journal.exists()
    return journal


def _recommit(journal: Path, text: bytes) -> None:
    """The journal with ``text`` as its plan, committed so its record matches."""
    data = journal.read_bytes()
    body = len(data) - COMMIT_RECORD.size
    _, at, _ = FOOTER.unpack(data[body - FOOTER.size : body])
    footer = FOOTER.pack(MAGIC, at, len(text))
    digest = hashlib.sha256(text + footer).digest()
    journal.write_bytes(data[:at] + text + footer + COMMIT_RECORD.pack(COMMIT_V2, digest))


def _forged(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def forge(journal: Path) -> None:
        plan, why = check_journal(str(journal))
        assert plan is not None, why
        change(plan)
        _recommit(journal, json.dumps(plan).encode())

    return forge


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda plan: plan.__setitem__(key, value)


def _payload_size(journal: Path) -> int:
    data = journal.read_bytes()
    body = len(data) - COMMIT_RECORD.size
    return int(FOOTER.unpack(data[body - FOOTER.size : body])[1])


FORGERIES: list[tuple[str, Callable[[Path], None], str]] = [
    ("1 TiB", _forged(_set("size", 1 << 40)), "leaves bytes 6048..1099511627776 of the file "),
    ("truncated", _forged(_set("size", 100)), "writes 2048 bytes from journal offset 0 to "),
    ("negative size", _forged(_set("size", -1)), "names size -1 after and 6048 before: not "),
    ("identifier", _forged(_set("ident", "zz")), "names identifier 'zz', not 4 bytes in hex"),
    ("no writes", _forged(lambda p: p.pop("writes")), "has writes or released ranges that "),
    ("writes 5", _forged(_set("writes", 5)), "has writes or released ranges that are not "),
    (
        "past the payload",
        _forged(lambda p: p["writes"][0].__setitem__(1, 1 << 30)),
        "writes 2048 bytes from journal offset 1073741824 to file offset ",
    ),
    ("punch", _forged(_set("punch", [[6000, 4096]])), "releases bytes 6000..10096, past the "),
    ("spaced identifier", _forged(_set("ident", "aa bb cc")), "names identifier 'aa bb cc', "),
    ("binding 5", _forged(_set("file", 5)), "binds it to a file described as 5: not a device, "),
    (
        "binding without its inode",
        _forged(lambda p: p["file"].pop("ino")),
        "binds it to a file described as {'ctime_ns': ",
    ),
    (
        "binding's device a string",
        _forged(lambda p: p["file"].__setitem__("dev", "sda")),
        "an inode, sizes, a SHA-256 and times",
    ),
    (
        "binding of another size",
        _forged(lambda p: p["file"].__setitem__("size_before", 1)),
        "binds it to a file of 1 bytes, its size before 6048",
    ),
    (
        "chunk index",
        _forged(lambda p: p["check"]["chunks"].__setitem__("x", "00" * 32)),
        "not digests (64 hex digits) by index",
    ),
    (
        "chunk digest",
        _forged(lambda p: p["check"].__setitem__("chunks", {"0": 5})),
        "checks chunks {'0': 5} and writes past the content {}: not digests",
    ),
    (
        "write index past the writes",
        _forged(lambda p: p["check"].__setitem__("beyond", {"7": "00" * 32})),
        "not digests (64 hex digits) by index",
    ),
    ("a list", lambda j: _recommit(j, b"[1, 2]"), "does not say what its payload must be"),
    ("not JSON", lambda j: _recommit(j, b"\xff{"), "is not JSON ("),
]


@pytest.mark.parametrize(
    ("forge", "why"), [f[1:] for f in FORGERIES], ids=[f[0] for f in FORGERIES]
)
def test_a_forged_plan_is_never_applied(
    tmp_path: Path, forge: Callable[[Path], None], why: str
) -> None:
    model = tmp_path / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    before = model.read_bytes()
    journal = _committed(model)
    forge(journal)
    plan, reason = check_journal(str(journal))
    assert plan is None and why in reason, reason
    if "payload" in why and "journal offset" in why:
        assert f"outside its payload ({_payload_size(journal)} bytes)" in reason
    assert ptestore.recover(model) == "discarded"  # never started: the file untouched
    assert model.read_bytes() == before and not journal.exists()


def test_a_forged_plan_beside_a_marked_file_is_named_not_applied(tmp_path: Path) -> None:
    model = tmp_path / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    journal = _committed(model)
    _forged(_set("size", 1 << 40))(journal)
    with open(model, "r+b") as f:  # as a run killed in its step 1 leaves it
        f.seek(4)
        f.write(b"PTJ~")
    before = model.read_bytes()
    with pytest.raises(StorageError) as err:
        ptestore.recover(model)
    assert str(err.value).startswith(f"{model}: damaged: the file is marked as being changed")
    assert "(its plan leaves bytes 6048..1099511627776 of the file unchecked)" in str(err.value)
    assert model.read_bytes() == before and model.stat().st_size == 6048 and journal.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory", "link"])
def test_what_is_not_a_journal_at_its_path_is_refused_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    model = tmp_path / "model.pte"
    shutil.copyfile(FX.pte_path, model)  # type: ignore[arg-type]
    journal = Path(journal_path(str(model)))
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "directory":
        journal.mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        journal.symlink_to(tmp_path / "elsewhere")
    outcome: list[BaseException] = []

    def describe() -> None:
        try:
            ptestore.describe(model)
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=describe, daemon=True)
    thread.start()
    thread.join(120)  # a ceiling only a hung open reaches
    assert not thread.is_alive(), "describe blocked on the journal's path"
    (err,) = outcome
    assert isinstance(err, StorageError)
    what = {
        "fifo": "this in-place journal is not a regular file (prw-r--r--)",
        "directory": "this in-place journal is not a regular file (drwxr-xr-x)",
        "link": "cannot read this in-place journal: a symbolic link",
    }[kind]
    assert str(err) == (
        f"{journal}: {what}; the file beside it is left as it is (remove the journal if "
        "no in-place run left it)"
    )


def test_a_journal_is_not_applied_to_a_rewrite_of_its_file(tmp_path: Path) -> None:
    """Rewritten in place after the commit (the same inode, size and first bytes; one
    byte of a chunk the plan does not touch): applying would mix the plan's writes with
    the rewrite's other bytes, so recover refuses and leaves both."""
    model = tmp_path / "big.pte"
    inflate(FX.pte_path, model, 5 << 20)
    key = FX.doubled.key  # type: ignore[union-attr]
    journal = _committed(model, [ReplaceKey("XnnpackBackend", key)])
    plan, _ = check_journal(str(journal))
    assert plan is not None
    cs = plan["check"]["chunk_size"]
    touched = {int(i) for i in plan["check"]["chunks"]}
    at = next(o for o in range(model.stat().st_size - 1, 0, -4096) if o // cs not in touched)
    st = model.stat()
    with open(model, "r+b") as f:  # a new version written over it
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # within a clock tick
    assert model.stat().st_ino == st.st_ino and model.stat().st_size == st.st_size
    before = model.read_bytes()
    with pytest.raises(StorageError) as err:
        ptestore.recover(model)
    msg = str(err.value)
    assert msg.startswith(f"{model}: not the file its journal {journal} was made for (")
    assert f"modified {plan['file']['mtime_ns']} ns" in msg
    assert msg.endswith(
        f"not applied, the file is left as it is. Remove {journal} if {model} was "
        "replaced on purpose"
    )
    assert model.read_bytes() == before and journal.exists()
