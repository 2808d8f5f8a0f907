"""Checks before any pair runs, so that a job-wide mistake is one message and exit 2
instead of one failure per pair: every backend loads, every source can be opened with
the job's storage options (a misspelt option, a missing object, bad credentials), and
(for a run) every destination prefix is writable: a marker object is created there
and deleted again.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from .._dataclass import replace
from .._oserror import local_error
from ..backends.registry import load_backend
from ..errors import ConfigurationError, PteStoreError
from ..storage.loaders import open_loader
from ..storage.routing import StorageOptions, options_for_loader
from ..storage.types import StorageURL, strerror
from .job import Job, JobError, pair_options

__all__ = [
    "check_job_options",
    "destination_prefix",
    "filter_job",
    "make_root",
    "preflight",
]

MARKER_PREFIX = ".ptestore-preflight-"


def filter_job(job: Job, models: list[str] | None, devices: list[str] | None) -> Job:
    """``job`` with only the named models and devices (None: all); an unknown name, or
    an empty list, is a :class:`JobError` naming the ones there are."""

    def pick(kind: str, have: list[str], want: list[str] | None) -> set[str] | None:
        if want is None:
            return None
        if not want:
            raise JobError(
                f"{job.path}: --{kind} names no {kind[:-1]} (an empty list; {kind}: "
                f"{', '.join(have)}): leave it out to take every {kind[:-1]}"
            )
        unknown = [n for n in want if n not in have]
        if unknown:
            raise JobError(
                f"{job.path}: --{kind} names no {kind[:-1]} {', '.join(map(repr, unknown))} "
                f"({kind}: {', '.join(have)})"
            )
        return set(want)

    m = pick("models", [x.name for x in job.models], models)
    d = pick("devices", [x.name for x in job.devices], devices)
    return replace(
        job,
        models=tuple(x for x in job.models if m is None or x.name in m),
        devices=tuple(x for x in job.devices if d is None or x.name in d),
    )


def _prefix(url: str) -> str:
    head = url.split("{", 1)[0]
    return head[: head.rfind("/") + 1] if "/" in head else ""


def destination_prefix(job: Job) -> str:
    """The directory or S3 prefix every destination of ``job`` lies under (the
    template before its first placeholder, to its last ``/``)."""
    return _prefix(job.destination)


def check_job_options(job: Job, *also: str) -> None:
    """A misspelt option (one no URL of the job accepts: its sources, its destinations,
    and ``also``, destinations of its own such as its index) is named, once, before any
    I/O: :class:`JobError` (exit 2)."""
    sources = [u for m in job.models for u in (m.source, m.ptd) if u]
    destinations = [d for p in job.pairs() for d in (p.destination, p.ptd_destination) if d]
    try:
        StorageOptions(job.storage_options).check(sources, [*destinations, *also])
    except ConfigurationError as exc:
        raise JobError(f"{job.path}: storage_options: {exc}") from exc


def preflight(job: Job, *, write: bool) -> None:
    """Raise :class:`JobError` (exit 2) for the first job-wide mistake found."""
    check_job_options(job)
    for spec in job.backends:
        try:
            load_backend(spec)
        except PteStoreError as exc:
            raise JobError(f"{job.path}: backends: {exc}") from exc
    seen: set[str] = set()
    for model in job.models:
        for url in [model.source] + ([model.ptd] if model.ptd else []):
            if url in seen:
                continue
            seen.add(url)
            try:
                open_loader(url, **options_for_loader(url, job.storage_options)).close()
            except PteStoreError as exc:
                raise JobError(f"{job.path}: model {model.name!r}: {exc}") from exc
    if write:
        _writable(job, _prefix(job.destination))


def make_root(job: Job) -> list[str]:
    """Create the local directory of the job's destination prefix (the destination
    root) and its missing parents: the ones made here, deepest first (none for a remote
    prefix, or one that exists). The run that asked owns them: it removes them again,
    and every empty directory under them, once its pairs have ended
    (:func:`~ptestore.writers._dirs.remove_empty_tree`), so that its pairs' writers,
    however many run at once, never make the root, and a run that fails or is
    interrupted after its preflight leaves no empty root."""
    from ..writers._dirs import make_parents

    u = StorageURL.of(f"{destination_prefix(job)}{MARKER_PREFIX}")
    if not u.local:
        return []
    directory = os.path.dirname(u.path)
    try:
        return make_parents(directory)
    except OSError as exc:
        raise local_error(
            exc, f"{directory}: cannot create the destination directory: {strerror(exc)}"
        ) from exc


def _writable(job: Job, prefix: str) -> None:
    """Create and delete a marker under ``prefix``. The local directories made for it
    are removed again (while empty, :mod:`ptestore.writers._dirs`): a run that fails
    after its preflight leaves no empty destination root; the run makes the root again
    for its pairs (:func:`make_root`), their writers the directories below it."""
    from ..writers import open_writer
    from ..writers._dirs import make_parents, remove_made

    marker = f"{prefix}{MARKER_PREFIX}{uuid.uuid4().hex}"
    made: list[str] = []
    try:
        u = StorageURL.of(marker)
        if u.local:
            directory = os.path.dirname(u.path)
            try:
                made = make_parents(directory)
            except OSError as exc:
                raise local_error(
                    exc, f"{u.path}: cannot create directory {directory}: {strerror(exc)}"
                ) from exc
        # The options a pair's writer gets (local destinations make their directories).
        w = open_writer(marker, **pair_options(marker, job.storage_options).for_writer(marker))
        try:
            w.write(b"ptestore preflight marker\n", 0)
            w.publish("create")
        finally:
            w.discard()
        _remove(marker, job.storage_options)
    except (PteStoreError, OSError) as exc:
        raise JobError(
            f"{job.path}: destination {prefix or '.'} is not writable (a marker could not "
            f"be created and deleted): {exc}"
        ) from exc
    finally:
        remove_made(made)


def _remove(url: str, options: dict[str, Any]) -> None:
    """Delete the marker at ``url``: a remote one through the filesystem
    :func:`~ptestore.storage.filesystems.open_filesystem` makes from the job's options
    (on S3 a client of its own, closed when done), its request retried by the policy of
    the ``retry_*`` options alone (s3fs's and botocore's retries off); a failure after
    its attempts is a :class:`~ptestore.errors.StorageError` naming the marker and the
    request."""
    u = StorageURL.of(url)
    if u.local:
        os.unlink(u.path)
        return
    from .._retry import to_storage_error
    from ..storage.filesystems import close_filesystem, open_filesystem

    fs, path, retry = open_filesystem(u, options_for_loader(url, options))
    request = "DeleteObject" if u.protocol == "s3" else "delete"
    try:
        retry.call(lambda: fs.rm_file(path), what=f"{url}: {request}")
    except Exception as exc:
        raise to_storage_error(exc, url, request) from exc
    finally:
        close_filesystem(fs)
