"""Which ``.pte`` files a packed-weight file was installed for, so that one no longer
used can go.

``fetch --xnnpack-cache`` installs the packed-weight file of ``DEST`` beside it
(:func:`~ptestore.xnnpack.adopt_cache`), and the next version of ``DEST`` gets a file
of another identity: without this, every update would leave the previous file (as large
as the weights) in the directory for good. So an installation names its ``.pte`` in the
file's record (``"installed_for"``: absolute paths; :func:`add_user`), and once a newer
file is installed for that ``.pte``, :func:`release` removes the ``.pte`` from the
records of the others and removes a file whose record then names none. A file made on
this machine (:func:`~ptestore.xnnpack.make_cache`), or installed before records named
their ``.pte``, names none to begin with and is never removed here, also when an
installation finds it already there (it is left naming none): only what an
installation added is taken away.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..errors import PteStoreError
from ..storage.flock import locked
from .record import publish_read_only, read_record

__all__ = ["USERS", "add_user", "release", "users_of"]

#: The record's field naming the ``.pte`` files a file was installed for.
USERS = "installed_for"


def users_of(record: dict[str, object]) -> list[str]:
    """The ``.pte`` files a record names as those its file was installed for."""
    users = record.get(USERS)
    return [u for u in users if isinstance(u, str)] if isinstance(users, list) else []


def add_user(record_path: Path, artifact: str) -> None:
    """Under the file's lock: name ``artifact`` (an absolute path) in its record."""
    record = read_record(record_path)
    users = users_of(record)
    if artifact not in users:
        record[USERS] = [*users, artifact]
        publish_read_only(json.dumps(record, indent=1).encode(), record_path)


def release(directory: Path, artifact: str, keep: Path) -> list[Path]:
    """``artifact`` (an absolute path) now has the packed-weight file ``keep``: every
    other file in ``directory`` installed for it no longer names it, and one installed
    for nothing else is removed (its record first: what makes it findable, then the
    file, then its lock). Returns the files removed."""
    removed: list[Path] = []
    for record_path in sorted(directory.glob("xnnpack-*.xpwc.json")):
        path = record_path.with_name(record_path.name[: -len(".json")])
        if path.name == keep.name:
            continue
        try:
            if artifact not in users_of(read_record(record_path)):
                continue
        except (OSError, PteStoreError):
            continue  # not a record of ours: left alone
        lock = path.with_name(path.name + ".lock")
        with locked(lock):
            try:
                record = read_record(record_path)
            except (OSError, PteStoreError):
                continue
            rest = [u for u in users_of(record) if u != artifact]
            if rest:
                record[USERS] = rest
                publish_read_only(json.dumps(record, indent=1).encode(), record_path)
                continue
            for p in (record_path, path, lock):  # the lock while held: see storage.flock.locked
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            removed.append(path)
    return removed
