"""The end of an in-place run (:mod:`.inplace`), from its last check of the file to its
apply: what it refuses before running any backend (:func:`check_rewritable`), the space
its writes need, reserved before the commit and given back when the run fails before it
(:class:`Reservation`), and the apply with Ctrl-C, SIGTERM and SIGHUP held
(:func:`apply_uninterrupted`), with the errors of a file replaced or rewritten meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .._oserror import local_error
from ..errors import ConfigurationError, StorageError
from ..journal import apply_journal, punch_hole, reserve_tail

__all__ = [
    "Reservation",
    "apply_uninterrupted",
    "check_rewritable",
    "check_size_limit",
    "interrupted_message",
    "modified_error",
    "replaced_error",
]


def check_rewritable(target: str, st: os.stat_result) -> None:
    """Before any work: refuse a file with more than one name (in place would change it
    under every one of them, and a run interrupted under this name would leave the
    others refused by the runtime with no journal beside them), and one this process
    cannot write (``st``: the file's ``fstat``)."""
    if st.st_nlink > 1:
        raise ConfigurationError(
            f"{target}: has {st.st_nlink} hard links; rewriting it in place would change "
            "it under every one of its names, and a run interrupted under this one would "
            "leave the others refused by the runtime with no journal beside them. Make it "
            "a file of its own first (copy it, and rename the copy over it), or specialize "
            "it to another file"
        )
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise local_error(
            exc,
            f"{target}: cannot be written ({exc.strerror}): in-place specialization "
            "rewrites the file itself; make it writable, or specialize it to another file",
        ) from exc
    os.close(fd)


def check_size_limit(target: str, journal: str, end: int, journal_size: int) -> None:
    """Before the commit: the file's planned size (``end``: its highest offset written)
    and the journal's (``journal_size``, an upper bound) within this process's file-size
    limit (``RLIMIT_FSIZE``), which the reservation's ``fallocate`` does not meet: past
    it, the apply would fail after the commit with the file marked."""
    from .._io import file_size_limit

    limit = file_size_limit()
    for what, size in ((target, end), (f"its journal {journal}", journal_size)):
        if limit is not None and size > limit:
            raise StorageError(
                f"{target}: in place, {what} would reach {size} bytes, past this process's "
                f"file-size limit of {limit} bytes (RLIMIT_FSIZE, ulimit -f); the file is "
                "unchanged: raise the limit and run again"
            )


def replaced_error(target: str, ran_on: os.stat_result, now: str, done: str) -> StorageError:
    """The refusal of a run whose file was renamed over (an update landed) while it ran:
    ``done`` says what became of its journal."""
    return StorageError(
        f"{target}: replaced by another file while it was specialized in place (the run "
        f"read device {ran_on.st_dev} inode {ran_on.st_ino}; the path now names {now}); "
        f"the file now at the path is left as it is, not specialized, and the file the "
        f"run read was not changed ({done}): specialize it again"
    )


def modified_error(target: str, was: str, now: str, done: str) -> StorageError:
    """The refusal of a run whose file was rewritten in place (the same inode) after the
    run's last check of it: ``was`` and ``now`` its size and times then and now."""
    return StorageError(
        f"{target}: modified while being specialized in place (the run bound it as {was}; "
        f"it is now {now}); not applied: the file is left as it was rewritten, not "
        f"specialized ({done}): specialize it again"
    )


def _stamps(st: os.stat_result) -> str:
    return f"{st.st_size} bytes, modified {st.st_mtime_ns} ns, changed {st.st_ctime_ns} ns"


def _holes(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The holes of the file in ``[start, end)`` (``SEEK_HOLE``/``SEEK_DATA``; none where
    the file system cannot tell)."""
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        try:
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
        except OSError:
            break
        if hole >= end:
            break
        try:
            data = os.lseek(fd, hole, os.SEEK_DATA)
        except OSError:  # ENXIO: a hole up to the end of the file
            data = end
        out.append((hole, min(data, end)))
        pos = data
    return out


class Reservation:
    """The space an in-place run's writes need, allocated before its commit
    (``fallocate(KEEP_SIZE)``: the file's size and bytes stay as they are): the holes
    among the ranges its plan writes inside the file (a sparse copy) and the file's
    growth past its end. A full disk then fails the run here, with the file as it was,
    not half-way through applying. Where the file system cannot allocate (no
    ``fallocate``), or allocates on every write (copy-on-write), the apply may still meet
    a full disk: its error then says that the journal is committed and kept.

    Every call goes through one descriptor checked to be the run's file (``ran_on``): a
    path renamed over by an update meanwhile is refused (nothing changed), and a
    ``ftruncate`` never cuts the update."""

    def __init__(self, target: str, ran_on: int) -> None:
        self.target = target
        self.ours = ours = os.fstat(ran_on)
        self.holes: list[tuple[int, int]] = []
        self.grown = False
        self.after: tuple[int, int, int] | None = None
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            try:
                there = os.stat(target)
            except OSError:
                there = None
            if there is not None and (there.st_dev, there.st_ino) == (ours.st_dev, ours.st_ino):
                raise local_error(
                    exc, f"{target}: cannot be written ({exc.strerror}); the file is unchanged"
                ) from exc
            now = f"nothing it can open ({exc.strerror})"
            raise replaced_error(target, ours, now, "its journal discarded") from exc
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (ours.st_dev, ours.st_ino):
            os.close(fd)
            now = f"device {st.st_dev} inode {st.st_ino}"
            raise replaced_error(target, ours, now, "its journal discarded")
        self.fd = fd
        self.size_before = st.st_size

    def reserve(
        self,
        writes: list[tuple[int, int, int]],
        old: int,
        new: int,
        unchanged: Callable[[], None],
    ) -> bool:
        """Allocate the holes of ``[dst, dst + n)`` of every write inside the file's
        ``old`` size, and ``[old, new)``; True when anything was allocated (the file's
        modification and change times moved: what the run bound is the file as it is
        after, and a change made before is refused by ``unchanged()``, called right
        before the first allocation)."""
        fd, holes = self.fd, []
        for dst, _, n in sorted(writes):
            if dst < old:
                holes += _holes(fd, dst, min(dst + n, old))
        grow = max(0, new - old)
        if holes or grow:
            unchanged()
        try:  # each range noted first: one that fails may be allocated in part
            for a, b in holes:
                self.holes.append((a, b))
                if not reserve_tail(fd, a, b - a):
                    self.holes.pop()  # the file system cannot: nothing allocated
            if grow:
                self.grown = True
                self.grown = reserve_tail(fd, old, grow)
        except OSError as exc:
            self._undo()
            in_holes = sum(b - a for a, b in holes)
            raise local_error(
                exc,
                f"{self.target}: cannot allocate {grow + in_holes} bytes for the run's "
                f"writes ({grow} past the end of the file, {in_holes} in its holes): "
                f"{exc.strerror}; the file is unchanged",
            ) from exc
        st = os.fstat(fd)
        self.after = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return bool(self.holes) or self.grown

    def check_size(self) -> None:
        """After :meth:`reserve`: the file still has the size the run read (a rewrite
        of another size while it allocated is refused)."""
        st = os.fstat(self.fd)
        if st.st_size != self.ours.st_size:
            raise modified_error(
                self.target, _stamps(self.ours), _stamps(st), "its journal discarded"
            )

    def _undo(self) -> None:
        for a, b in self.holes:
            punch_hole(self.fd, a, b - a)  # holes again (they read as zeros either way)
        self.holes = []
        if self.grown and os.fstat(self.fd).st_size == self.size_before:
            os.ftruncate(self.fd, self.size_before)  # the same size: frees past the end
        self.grown = False

    def release(self) -> None:
        """Give back what :meth:`reserve` allocated (the run failed before its commit),
        while the file is as the reservation left it (a rewrite since is not the run's
        to cut or punch); the descriptor is closed."""
        try:
            st = os.fstat(self.fd)
            if self.after is None or (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == self.after:
                self._undo()
        except OSError:
            pass  # best effort: the file's bytes are as they were either way
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def interrupted_message(target: str) -> str:
    """What a Ctrl-C (SIGTERM, SIGHUP) held from the commit to the end of the apply says
    (``ptestore ...: interrupted <this>``)."""
    return (
        f"while {target} was rewritten in place: the change was completed first (its "
        "journal was committed, so it was applied to the end): the file is the "
        "specialized model, loadable"
    )


def apply_uninterrupted(target: str, journal: str, plan: dict[str, Any]) -> None:
    """Apply the committed ``journal``, holding Ctrl-C, SIGTERM and SIGHUP until it is
    done (in the main thread; the run holds them from its commit already): an interrupt
    there would leave the file torn (refused by the runtime), and completing it is safe
    (the journal is durable, applying is idempotent). A held signal is then delivered
    as it would have been, a :class:`KeyboardInterrupt` saying that the file was
    completed (:func:`~ptestore._signals.signals_held`)."""
    from .._signals import signals_held

    with signals_held(interrupted_message(target)):
        apply_journal(target, journal, plan)
