"""Every exception class ptestore defines survives pickling: a process pool pickles a
worker's exception, and one that cannot be rebuilt breaks ``ProcessPoolExecutor`` and
hangs ``multiprocessing.Pool.get()`` for ever. A class this table does not name fails
the test, so a new class is added here with the arguments it is raised with."""

from __future__ import annotations

import errno
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from types import ModuleType

import pytest

import ptestore
from ptestore.errors import StorageError
from ptestore.fleet.work import PairResult
from ptestore.journal import ApplyFailed

#: Attributes compared besides type, str, args and errno (the documented ones).
_ATTRS = (
    "path",
    "provenance",
    "backend_ids",
    "installed",
    "hint",
    "backend",
    "method",
    "key",
    "spec",
    "files",
    "source",
    "field",
    "value",
    "limit",
    "detail",
    "holder",
    "url",
    "expected",
    "found",
    "refused_by",
    "published",
    "artifact",
    "reason",
    "transient",
    "target",
    "journal",
    "marked",
    "now",
    "rewritten",
    "kind",
    "link",
    "filename",
    "strerror",
    "signum",
    "result",
)


def _modules() -> list[ModuleType]:
    found = [ptestore]
    for info in pkgutil.walk_packages(ptestore.__path__, "ptestore."):
        if not info.name.endswith("__main__"):  # runs the command line when imported
            found.append(importlib.import_module(info.name))
    return found


def _classes() -> dict[str, type[BaseException]]:
    out: dict[str, type[BaseException]] = {}
    for module in _modules():
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.split(".")[0] == "ptestore"
            ):
                out[f"{value.__module__}:{value.__qualname__}"] = value
    return out


def _fleet_result() -> object:
    from ptestore.fleet.runner import FleetResult

    done = PairResult("m", "pixel", "file:///out/m.pte", "done", seconds=1.5)
    failed = PairResult("m", "tablet", "file:///out/t.pte", "failed", error="interrupted")
    return FleetResult(pairs=[done, failed], seconds=2.0)


def _apply_failed() -> BaseException:
    cause = OSError(errno.ENOSPC, "No space left on device")
    return ApplyFailed("/m/model.pte", "/m/.model.pte.ptestore-jrnl2", cause, True)


def _node() -> object:
    from ptestore.fleet.index_nodes import Node

    return Node(prefix="ab", kind="split")


_M = "Message naming /data/model.pte"

#: How each class is raised: "module:qualname" -> its arguments (positional, keyword).
_TABLE: dict[str, Callable[[type[BaseException]], BaseException]] = {
    "ptestore._background:Cancelled": lambda c: c("cancelled"),
    "ptestore._signals:Terminated": lambda c: c(signal.SIGTERM),
    "ptestore.checksums:ChecksumUnavailable": lambda c: c(f"{_M}: no CRC32C"),
    "ptestore.cli.exits:OutputError": lambda c: c("stdout: closed", errno=errno.EPIPE),
    "ptestore.device.stale:_Unknown": lambda c: c("unmounted"),
    "ptestore.errors:AlreadyExists": lambda c: c(_M, errno=errno.EEXIST),
    "ptestore.errors:AlreadySpecialized": lambda c: c(
        _M, path="/data/model.pte", provenance={"ptestore": "1"}
    ),
    "ptestore.errors:BackendError": lambda c: c(
        _M, backend="xnnpack", method="specialize", key="w0", spec="cpu"
    ),
    "ptestore.errors:ConfigurationError": lambda c: c(_M),
    "ptestore.errors:FormatError": lambda c: c(
        "/data/model.pte", "program_size", 1 << 40, "at most 1 GiB", "the header"
    ),
    "ptestore.errors:IntegrityError": lambda c: c(_M, published=False),
    "ptestore.errors:InvalidReplacement": lambda c: c(_M, backend="b", method="m", key="k"),
    "ptestore.errors:LockTimeout": lambda c: c(_M, path="/locks/k", holder=4242),
    "ptestore.errors:MissingNamedData": lambda c: c(_M, key="w0", files=("a.ptd",)),
    "ptestore.errors:ModelRetired": lambda c: c(_M),
    "ptestore.errors:NotSupported": lambda c: c(_M),
    "ptestore.errors:NothingSpecialized": lambda c: c(
        _M, backend_ids=("XnnpackBackend",), installed=("x",), hint="install it"
    ),
    "ptestore.errors:ObjectNotFound": lambda c: c(_M, errno=errno.ENOENT),
    "ptestore.errors:PackedWeightsRefused": lambda c: c("/data/m.bin", "short", transient=True),
    "ptestore.errors:PartialPublish": lambda c: c(_M, published=("s3://b/m.pte",)),
    "ptestore.errors:PermissionDenied": lambda c: c(_M, errno=errno.EACCES),
    "ptestore.errors:PreconditionFailed": lambda c: c(
        _M, url="s3://b/m.pte", expected="v1", found="v2", refused_by="ptestore"
    ),
    "ptestore.errors:PteStoreError": lambda c: c(_M),
    "ptestore.errors:PublishUncertain": lambda c: c(_M, errno=errno.ETIMEDOUT),
    "ptestore.errors:StorageError": lambda c: c(_M, errno=errno.ENOSPC),
    "ptestore.errors:WriterStateError": lambda c: c(_M),
    "ptestore.fleet.fetch_checks:EntryMismatch": lambda c: c(_M, published=True),
    "ptestore.fleet.index_repair:_Again": lambda c: c(),
    "ptestore.fleet.index_trie:_Moved": lambda c: c(_node()),
    "ptestore.fleet.index_v3:_Again": lambda c: c(),
    "ptestore.fleet.job:JobError": lambda c: c(_M),
    "ptestore.fleet.ranged:ObjectChanged": lambda c: c(_M),
    "ptestore.fleet.ranged:_OtherRange": lambda c: c(_M, published=False),
    "ptestore.fleet.runner:FleetInterrupted": lambda c: c(_fleet_result()),
    "ptestore.fleet.worker:WorkerUnfit": lambda c: c(_M),
    "ptestore.journal:ApplyFailed": lambda c: _apply_failed(),
    "ptestore.journal_binding:OtherFile": lambda c: c(_M, now="device 1 inode 2", rewritten=True),
    "ptestore.storage.regular:NotRegular": lambda c: c("/data/d", "a directory", False),
    "ptestore.testing.runtime:RuntimeFailure": lambda c: c(_M),
    "ptestore.testing.seaweedfs:_ExitedEarly": lambda c: c(_M),
    "ptestore.verification:_Unrated": lambda c: c(_M),
    "ptestore.xnnpack.child:ProbeError": lambda c: c(_M),
}

#: Internal signals that never leave the process that raised them, with the reason.
_NEVER_PICKLED = {
    # Carries the trie node read in this process (a value of the index's store).
    "ptestore.fleet.index_trie:_Moved": "raised and caught inside one index update",
}

_CLASSES = _classes()


def test_the_table_names_every_exception_class() -> None:
    assert sorted(set(_CLASSES) - set(_TABLE)) == []
    assert sorted(set(_TABLE) - set(_CLASSES)) == []


def _same(a: BaseException, b: BaseException) -> None:
    assert type(b) is type(a)
    assert str(b) == str(a)
    assert b.args == a.args
    assert getattr(b, "errno", None) == getattr(a, "errno", None)
    for name in _ATTRS:
        if hasattr(a, name):
            assert getattr(b, name) == getattr(a, name), name
    assert vars(b) == vars(a)


@pytest.mark.parametrize("name", sorted(set(_TABLE) - set(_NEVER_PICKLED)))
def test_round_trips_through_pickle(name: str) -> None:
    exc = _TABLE[name](_CLASSES[name])
    _same(exc, pickle.loads(pickle.dumps(exc)))


def test_round_trip_keeps_what_each_fix_is_about() -> None:
    """The values the review found lost, spelled out."""
    failed = pickle.loads(pickle.dumps(_apply_failed()))
    assert isinstance(failed, ApplyFailed) and isinstance(failed, StorageError)
    assert (failed.errno, failed.marked) == (errno.ENOSPC, True)
    assert failed.journal == "/m/.model.pte.ptestore-jrnl2"
    assert "free space on its file system" in str(failed)

    from ptestore.storage.regular import NotRegular

    plain = pickle.loads(pickle.dumps(NotRegular("/data/d", "a directory", False)))
    assert (plain.errno, plain.strerror, plain.filename) == (errno.EINVAL, "a directory", "/data/d")
    link = pickle.loads(pickle.dumps(NotRegular("/data/l", "a symbolic link", True)))
    assert (link.errno, link.link) == (errno.ELOOP, True)

    from ptestore._signals import Terminated

    assert pickle.loads(pickle.dumps(Terminated(signal.SIGHUP))).signal_name == "SIGHUP"


def test_apply_failed_is_rebuilt_from_its_own_message_not_the_redacted_one() -> None:
    """As every class of errors.py: ``args`` (what a handler or a log reads unredacted)
    survive; only ``str()`` redacts (a local directory named like a URL with a password)."""
    target = "/m/https://user:secret@host/model.pte"
    cause = OSError(errno.EIO, "Input/output error")
    exc = ApplyFailed(target, "/m/https://user:secret@host/.model.pte.ptestore-jrnl2", cause, False)
    assert "secret" in exc.args[0] and "secret" not in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    _same(exc, back)
    assert back.args[0] == exc.args[0] and back.target == target


def _fail_to_apply() -> None:
    raise _apply_failed()


def test_apply_failed_crosses_a_process_pool() -> None:
    """A worker's ApplyFailed reaches the caller as itself (was: the pool broke)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        future = pool.submit(_fail_to_apply)
        # A hang guard only: the answer comes as soon as the worker raised.
        with pytest.raises(ApplyFailed) as caught:
            future.result(timeout=120)
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.marked is True
    assert caught.value.target == "/m/model.pte"
