"""The small JSON objects of a fleet index: read with their version, updated by
compare-and-swap, listed, counted.

One :class:`IndexStore` per index and operation. Every update is a read-modify-write
inside the conflict retry loop (:data:`~ptestore._retry.CONFLICT_RETRY`): the object is
read with its version token (:func:`~ptestore.writers.versions.read_versioned`), changed
by a *transform*, and published with ``publish(mode="if-match", expected=token)``, or
``mode="create"`` when there was no object; a conflict (another writer published first)
reads again and redoes the change. The writers do the compare-and-swap (S3 ``If-Match``
/ ``If-None-Match``, a hash check under an ``flock`` on local disks, a hash check under
a lock in memory: docs/storage.md). Each object's attempts and conflicts are kept
(:class:`ObjectStats`, :mod:`.index_stats`), and every read is counted (objects, bytes,
requests), so a run can report its contention per shard and ``select`` what it read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import AlreadyExists, FormatError, PreconditionFailed, PublishUncertain
from ..storage.routing import StorageOptions, options_for_loader, options_for_writer
from ..storage.types import StorageURL, split_url
from .index_bounds import (
    ENTRY_ROOM,
    MAX_CATALOG_BYTES,
    MAX_ROOT_BYTES,
    MAX_V2_BYTES,
    check_root_size,
    oversize,
    parse_object,
)
from .index_listing import StoreListing
from .index_stats import ObjectStats, ReadCount, shards_line

__all__ = [
    "CAS_PROTOCOLS",
    "IndexStore",
    "ObjectStats",
    "ReadCount",
    "check_index_options",
    "check_named_options",
    "dumps",
    "shards_line",
]

#: Stores whose writers publish conditionally (``publish(mode="if-match")``).
CAS_PROTOCOLS = ("file", "memory", "s3")

#: ``transform(value, version) -> new value`` (None: leave the object as it is).
Transform = Callable[[dict[str, Any] | None, str | None], dict[str, Any] | None]


def dumps(value: dict[str, Any], *, compact: bool = True) -> bytes:
    """The bytes an index object is stored as (compact JSON for shards and catalogs)."""
    if compact:
        return json.dumps(value, separators=(",", ":")).encode()
    return json.dumps(value, indent=1).encode()


def check_index_options(
    options: Mapping[str, Any] | None,
    index: str,
    *,
    write: bool = False,
    given: Iterable[str] = (),
    local_ok: bool = False,
) -> None:
    """Refuse, before the index at ``index`` is read, a storage option that applies to
    none of it (as :class:`IndexStore` reads it and, with ``write``, writes it) and of
    the command's other URLs ``given``: the one check
    (:meth:`~ptestore.storage.routing.StorageOptions.check`): the store passes on
    only the options its URL takes, so ``-o endpoint_ulr=...`` would otherwise be
    dropped unsaid and the index read from AWS's endpoint. A memory:// index is read
    through its writer's store (it takes the writer's ``fs``): it counts as written.
    Options for a local index alone are refused, unless ``local_ok`` (``fetch``,
    ``ensure``: they reach the files it names, :func:`check_named_options`)."""
    if not options:
        return
    written = write or split_url(index)[0] == "memory"
    read = [] if written else [index]
    StorageOptions(options).check([*read, *given], [index] if written else [], local_ok=local_ok)


def check_named_options(options: Mapping[str, Any] | None, index: str, urls: Iterable[str]) -> None:
    """Once a local index is read, before any of the files it names is: refuse a
    storage option that applies to none of the remote ``urls`` it names (the files a
    ``fetch`` reads), naming the index; left unused when those are all local. Options
    for a remote index were checked before it was read (:func:`check_index_options`)."""
    from ..errors import ConfigurationError

    if not options or not StorageURL.of(index).local:
        return
    try:
        StorageOptions(options).check(urls, local_ok=True)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{index}: the files it names: {exc}") from None


class IndexStore:
    """Read, update and list the JSON objects of the index at ``root`` (its URL)."""

    def __init__(self, root: str, options: dict[str, Any] | None = None) -> None:
        self.root = root
        self.options = dict(options or {})
        self.protocol = split_url(root)[0]
        self.cas = self.protocol in CAS_PROTOCOLS
        self.reads = ReadCount()
        #: The bound of a trie node (:meth:`limit`): its layout's ``leaf_bytes`` plus one
        #: entry, set by the sharded index that reads it (the largest layout until then).
        self.leaf_limit = (1 << 24) + ENTRY_ROOM
        local = StorageURL.of(root).local
        # The version is read where the writer publishes: memory:// through the writer's
        # own store (it takes the writer's options), S3 with the reading side's options.
        if local:
            self.read_options: dict[str, Any] = {}
        elif self.protocol == "memory":
            self.read_options = options_for_writer(root, self.options)
        else:
            self.read_options = options_for_loader(root, self.options, "dst")
        self.write_options: dict[str, Any] = (
            {"auto_mkdir": True} if local else options_for_writer(root, self.options)
        )
        #: Listings and removals, through one filesystem of the read side's options.
        self.listing = StoreListing(self.protocol, self.read_options)
        if self.protocol == "s3":  # served as JSON
            extra = dict(self.write_options.get("s3_additional_kwargs") or {})
            extra.setdefault("ContentType", "application/json")
            self.write_options["s3_additional_kwargs"] = extra
            # One client for the many small objects of an index, not one per object (a
            # client costs far more than a small request): the process's shared one for
            # these options and the credentials' current state (bounded; never fsspec's
            # instance cache, which kept one per option set and its first credentials).
            for opts in (self.read_options, self.write_options):
                opts.setdefault("skip_instance_cache", False)

    def require_cas(self) -> None:
        """:class:`~ptestore.errors.ConfigurationError` unless the store has
        compare-and-swap (what a sharded index needs)."""
        if not self.cas:
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"{self.root}: a sharded index needs a store with compare-and-swap (local "
                "files, memory://, s3://)"
            )

    def missing(self) -> Exception:
        """The :class:`~ptestore.errors.ObjectNotFound` of an index that is not there."""
        from ..errors import ObjectNotFound

        u = StorageURL.of(self.root)
        return ObjectNotFound(
            f"{u.path}: no such file" if u.local else f"{self.root}: no such object"
        )

    # -- URLs -------------------------------------------------------------------------
    def base(self) -> str:
        """The directory of the root object, with its trailing separator."""
        cut = self.root.rfind("/")
        return self.root[: cut + 1] if cut >= 0 else ""

    def url(self, relative: str) -> str:
        """The URL of ``relative`` (a ``/``-separated name) beside the root."""
        return self.base() + relative

    # -- reading ----------------------------------------------------------------------
    def limit(self, url: str) -> tuple[int, str]:
        """The most bytes the object at ``url`` may have, and what it is (the root may
        be a version 1/2 index: :data:`MAX_V2_BYTES`)."""
        if url == self.root:
            return MAX_V2_BYTES, "index"
        if url.endswith("/catalog.json"):
            return MAX_CATALOG_BYTES, "index catalog"
        return self.leaf_limit, "index shard"

    def read(self, url: str, *, oversize_ok: bool = False) -> tuple[bytes, str | None]:
        """``(bytes, version)`` of the object at ``url``; ``(b"", None)`` when absent.
        :class:`FormatError` when it is larger than its bound (:meth:`limit`), unless
        ``oversize_ok`` (then ``(b"", version)``: what replaces a damaged object needs).
        The root URL is read as :meth:`read_root` says."""
        from ..writers.versions import read_versioned

        if url == self.root:
            return self.read_root()
        cap, what = self.limit(url)
        got = read_versioned(url, max_bytes=cap, **self.read_options)
        self.reads.add(None if got.version is None else len(got.data))
        if got.oversize is not None and not oversize_ok:
            raise oversize(url, what, got.oversize, cap)
        return got.data, got.version

    def read_root(self) -> tuple[bytes, str | None]:
        """The root URL's bytes and version: within a version 3 root's bound in one read;
        an object larger than that only once its first bytes show a version 1/2 index
        (:mod:`.index_root`: a padded version 3 root is refused from them), then within
        :data:`MAX_V2_BYTES`."""
        from ..writers.versions import read_versioned
        from .index_root import check_root_head, local_size, read_head

        url = self.root
        size = local_size(url)  # a local file is not read (hashed) to learn it is large
        if size is None or size <= MAX_ROOT_BYTES:
            got = read_versioned(url, max_bytes=MAX_ROOT_BYTES, **self.read_options)
            if got.oversize is None:
                self.reads.add(None if got.version is None else len(got.data))
                return got.data, got.version
            self.reads.part(0)  # S3: its body not read
            size = got.oversize
        if size > MAX_V2_BYTES:
            raise oversize(url, "index", size, MAX_V2_BYTES)
        head = read_head(url, options_for_loader(url, self.options, "dst"))
        if head is None:
            return b"", None  # removed meanwhile
        self.reads.part(len(head[0]))
        check_root_head(*head, url)
        got = read_versioned(url, max_bytes=MAX_V2_BYTES, **self.read_options)
        self.reads.add(None if got.version is None else len(got.data))
        if got.oversize is not None:
            raise oversize(url, "index", got.oversize, MAX_V2_BYTES)
        return got.data, got.version

    def read_json(self, url: str) -> tuple[dict[str, Any] | None, str | None]:
        """The object at ``url`` parsed (None when absent) and its version."""
        data, version = self.read(url)
        if version is None:
            return None, None
        value = parse_object(data, url)
        if url == self.root:
            check_root_size(value, len(data), url)
        return value, version

    def read_many(self, urls: list[str]) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
        """:meth:`read_json` of each of ``urls``, several at once."""
        unique = list(dict.fromkeys(urls))
        if len(unique) <= 1:
            return {u: self.read_json(u) for u in unique}
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:
            return dict(zip(unique, pool.map(self.read_json, unique), strict=True))

    # -- writing ----------------------------------------------------------------------
    def write(
        self, url: str, value: dict[str, Any], mode: str, expected: str | None = None
    ) -> None:
        """Publish ``value`` at ``url`` (``"create"``, ``"if-match"`` with ``expected``,
        or ``"overwrite"``); :class:`FormatError` when it is larger than its bound
        (:meth:`check_size`), before anything is written."""
        from ..writers import open_writer

        data = dumps(value, compact=url != self.root)
        self.check_size(url, data)
        w = open_writer(url, **self.write_options)
        try:
            w.write(data, 0)
            if mode == "if-match":
                w.publish("if-match", expected=expected)
            else:
                w.publish("create" if mode == "create" else "overwrite")
        finally:
            w.discard()  # a no-op once published

    def check_size(self, url: str, data: bytes) -> None:
        """:class:`FormatError` when ``data``, to be published at ``url``, is larger than
        a reader reads there (:meth:`limit`): ptestore never publishes an object it
        would refuse to read."""
        cap, what = self.limit(url)
        if len(data) > cap:
            raise FormatError(
                url,
                f"{what} size",
                len(data),
                f"at most {cap} bytes",
                "not written: a reader of the index refuses a larger one",
            )

    def create(self, url: str, value: dict[str, Any]) -> bool:
        """Create the object at ``url``; False when one is there already."""
        try:
            self.write(url, value, "create")
        except AlreadyExists:
            return False
        return True

    def update(
        self,
        url: str,
        transform: Transform,
        stats: ObjectStats,
        first: tuple[dict[str, Any] | None, str | None] | None = None,
        *,
        confirm_unchanged: bool = False,
    ) -> tuple[dict[str, Any] | None, str | None, bool]:
        """Read the object at ``url``, change it with ``transform`` and publish it if it
        is still the version read; again on a conflict. ``first`` is a read already made
        (used by the first attempt). Returns the value now there, the version it was
        read at, and whether this call published it. An exception ``transform`` raises
        (other than a conflict) ends the loop and is raised.

        A write whose outcome is unknown (:class:`~ptestore.errors.PublishUncertain`: an
        attempt's answer was lost, and a retry was refused by a version that is not
        ours) is read again like a conflict. When what is there now is what that attempt
        wrote, it landed: the call ends as having published it, and ``transform`` is not
        run on it again (a catalog's transform counts the splits it is given: run again
        on its own output it would count them twice). Otherwise ``transform`` is run on
        what is there, as after a conflict: a change it makes by set semantics (an entry,
        a placement) is right whether or not the uncertain write landed first, a count
        (splits) is counted again when that write landed and another writer replaced it
        since (a catalog's leaf counts are a hint its readers check: :mod:`.index_catalog`).
        If nothing is left to change, the call counts as having published (it may have).

        ``transform`` returning None (nothing to change) on ``first`` ends the call as it
        is, unless ``confirm_unchanged``: then the object is read again and the answer
        taken from what is there now. A write made on a stale read fails its
        compare-and-swap and is retried, but "nothing to change" is never checked by
        the store, so an object derived from others written since ``first`` (a catalog
        from its leaves) must confirm it."""
        from .._retry import CONFLICT_RETRY, is_conflict

        given = [first]
        out: list[Any] = [None, None, False]
        maybe_ours = [False]  # an attempt whose write may have landed (PublishUncertain)
        # What that attempt wrote, as a reader parses it back.
        uncertain: list[dict[str, Any] | None] = [None]

        def attempt() -> None:
            stats.attempts += 1
            got, given[0] = given[0], None
            value, version = got if got is not None else self.read_json(url)
            if uncertain[0] is not None and value == uncertain[0]:
                out[:] = [value, version, True]  # it landed, and is still there
                stats.written = True
                return
            new = transform(value, version)
            if new is None and got is not None and confirm_unchanged:
                value, version = self.read_json(url)
                new = transform(value, version)
            if new is None:
                out[:] = [value, version, maybe_ours[0]]
                stats.written = stats.written or maybe_ours[0]
                return
            try:
                self.write(url, new, "create" if version is None else "if-match", version)
            except (PreconditionFailed, AlreadyExists):
                stats.conflicts += 1
                raise
            except PublishUncertain:
                stats.conflicts += 1
                stats.uncertain += 1
                maybe_ours[0] = True
                uncertain[0] = json.loads(dumps(new))
                raise
            out[:] = [new, version, True]
            stats.written = True

        try:
            # Conflicts are expected when runs share shards, and each is reported (the
            # run's index_shards): logged at DEBUG, not once per retry as a warning.
            CONFLICT_RETRY.call(
                attempt,
                what=f"{url}: index update",
                retry_on=lambda exc: is_conflict(exc) or isinstance(exc, PublishUncertain),
                level=logging.DEBUG,
            )
        except PreconditionFailed as exc:
            raise PreconditionFailed(
                f"{url}: the index changed under every one of {stats.attempts} attempts to "
                f"merge into it (last: {exc})",
                url=url,
                expected=exc.expected,
                found=exc.found,
                refused_by=exc.refused_by,
            ) from exc
        return out[0], out[1], out[2]

    # -- listing ----------------------------------------------------------------------
    def list_names(self, url: str, prefix: str = "") -> list[str]:
        """The names of the entries directly under the directory ``url`` that begin
        with ``prefix`` (:meth:`.index_listing.StoreListing.names`: a remote store's
        listed through its one filesystem, retried by the ``retry_*`` options' policy)."""
        return self.listing.names(url, prefix)

    def remove_tree(self, url: str) -> None:
        """Remove everything under the directory ``url``, best effort
        (:meth:`.index_listing.StoreListing.remove_tree`)."""
        self.listing.remove_tree(url)
