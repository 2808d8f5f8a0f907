"""One (model, device) pair: check its destination, specialize, publish, verify.

:func:`run_pair` is the unit of work of every runner (inline, process pool, Dask): a
module-level function of one picklable :class:`PairTask`, returning a
:class:`PairResult` and never raising, so one pair's failure stops no other.

Publishing is create-or-verify: a pair whose destination is empty publishes with
``mode="create"`` (no-clobber); when another worker won the race, the artifact it
published is accepted only if its provenance key is the one this pair wants. After
every publish the destination's trailer is read back and checked the same way, so two
workers racing on one pair never leave a wrong artifact unreported (its bytes are read
only when its record names another digest than the one this run published).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..backends.compat import version_of
from ..backends.registry import load_backend
from ..errors import AlreadyExists, ConfigurationError, ObjectNotFound, PteStoreError
from ..provenance import ProvenanceKey, ProvenanceRequest, SourceInfo
from ..provenance.record import JobStamp
from ..storage.loaders import DataLoader, open_loader
from ..storage.routing import options_for_loader
from ..storage.types import StorageURL
from .job import pair_options

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..backends.api import BackendInterface
    from ..backends.compat import DeviceProfile
    from ..provenance import Provenance
    from ..writers.base import PublishMode

__all__ = [
    "CountingLoader",
    "PairResult",
    "PairTask",
    "check_destination",
    "open_counted",
    "refuse_dangling_link",
    "run_pair",
]


@dataclass(frozen=True)
class PairTask:
    """Everything a worker needs for one pair (picklable)."""

    model: str
    device: DeviceProfile
    source: str
    ptd: str | None
    destination: str
    ptd_destination: str | None
    backends: tuple[str, ...]
    storage_options: dict[str, Any]
    #: The sources as the planner described them (digests computed once per model).
    sources: dict[str, SourceInfo]
    #: The provenance key a current artifact has.
    key: ProvenanceKey
    #: The job file (path, sha256) recorded in the provenance.
    job: tuple[str, str] | None = None
    #: Where the pair's .ptd is stored once, by content (``<root>/_shared/sha256-tree/``,
    #: :mod:`.shared`); None for a model without a .ptd.
    shared_root: str | None = None
    #: The device's CPU fingerprint when it asks for XNNPACK's packed-weight file
    #: (:mod:`.packing`: made on a worker with that CPU).
    xnnpack_cpu: str | None = None
    #: Seconds each run of the runtime's child may take there (None: the default).
    xnnpack_timeout: float | None = None
    #: The shared objects stored when the run started that no live index entry named
    #: (their identities, :mod:`.reuse`): one found stored is held before it is relied
    #: on (:mod:`.holds`). None (a task made outside a run): any one found is held.
    hold_shared: frozenset[tuple[str, str]] | None = None
    #: The identities the pair's live index entry named when the run started
    #: (:mod:`.reuse`): what a worker finds current among them is not held (gc keeps
    #: it). None (a task made outside a run): unknown.
    named: frozenset[tuple[str, str]] | None = None


@dataclass
class PairResult:
    """How one pair ended: ``status`` is ``"done"``, ``"skipped"`` or ``"failed"``."""

    model: str
    device: str
    destination: str
    status: str
    error: str | None = None
    seconds: float = 0.0
    #: Bytes read and written through this client for the pair.
    bytes: int = 0
    #: Why it ran or was skipped (not part of the ``--json`` output).
    reason: str = field(default="", compare=False)
    #: How many times the pair was tried (transient failures are retried).
    attempts: int = 1
    #: For a device that declares ``xnnpack_cpu``: what became of the artifact's XNNPACK
    #: packed-weight file (made, current, or why the runtime refused one).
    xnnpack: str | None = None
    #: Why no backend changed the artifact this run published (a copy of the portable
    #: source, made for no backend: ``select`` offers it to every device), else None.
    unspecialized: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "device": self.device,
            "destination": self.destination,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 6),
            "bytes": self.bytes,
            "attempts": self.attempts,
        }
        if self.xnnpack is not None:
            out["xnnpack"] = self.xnnpack
        if self.unspecialized is not None:
            out["unspecialized"] = self.unspecialized
        return out


class CountingLoader:
    """Counts the bytes read through another loader (what it asked of its store, when it
    says: ``bytes_fetched``; a small object is fetched whole once)."""

    def __init__(self, inner: DataLoader, counter: list[int]) -> None:
        self.inner = inner
        self.name = inner.name
        self._counter = counter

    def size(self) -> int:
        return self.inner.size()

    def load(self, offset: int, size: int) -> bytes | bytearray | memoryview:
        before = getattr(self.inner, "bytes_fetched", None)
        data = self.inner.load(offset, size)
        after = getattr(self.inner, "bytes_fetched", None)
        self._counter[0] += size if before is None or after is None else after - before
        return data

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in ("readinto", "view"):  # a local file's reads: counted as loads are
            return self._counted(name, value)
        return value

    def _counted(self, name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(offset: int, arg: Any) -> Any:
            out = read(offset, arg)
            self._counter[0] += memoryview(arg).nbytes if name == "readinto" else int(arg)
            return out

        return counted


def open_counted(url: str, options: dict[str, Any], counter: list[int]) -> DataLoader:
    """A loader for ``url`` (with the options that apply to reading) that adds the bytes
    it reads to ``counter[0]``."""
    return CountingLoader(open_loader(url, **options_for_loader(url, options)), counter)


def refuse_dangling_link(url: str) -> None:
    """Raise a :class:`ConfigurationError` when a local ``url`` found missing is a
    symbolic link to nothing: it is not an empty destination (a create would find the
    name taken, and report a race that never happened)."""
    u = StorageURL.of(url)
    if not u.local or not os.path.islink(u.path):
        return
    try:
        target = os.readlink(u.path)
    except OSError:  # pragma: no cover - removed meanwhile: missing after all
        return
    raise ConfigurationError(
        f"a dangling symbolic link at {u.path} (to {target!r}): a run neither writes "
        "through it nor replaces it; remove it (or point it at a file)"
    )


def check_destination(
    urls: list[str],
    options: dict[str, Any],
    want: ProvenanceKey,
    counter: list[int],
    shared_root: str | None = None,
    published: Mapping[str, str] | None = None,
    opened: list[str] | None = None,
    rate: tuple[Mapping[str, BackendInterface], DeviceProfile] | None = None,
) -> tuple[bool, str]:
    """``(current, reason)`` for the artifact at ``urls`` (the .pte, then a .ptd): its
    provenance key is ``want`` and its bytes are the ones the record names (see
    :mod:`.binding`). With ``shared_root`` the .ptd is the one stored under it by the
    content address the .pte's record names (:mod:`.shared`), not ``urls[1]``.
    ``published``: what this run just published (:func:`~.binding.check_artifact`).
    ``opened``: each object found is appended to it (what a current artifact is).
    ``rate``: ``(SPEC -> implementation, the pair's device)``: a current artifact that
    any of its backends rates below ``OPTIMAL`` for that device is not current (its
    reason names the backend and the rating, as ``verify --job`` does:
    :func:`~ptestore.backends.rating.below_optimal`); a failure to rate raises the
    backend's :class:`~ptestore.errors.BackendError`. Not after a publish: an artifact
    just made is what the backends make now, whatever they rate it."""
    from .binding import check_artifact

    def open_(url: str) -> DataLoader:
        try:
            loader = open_counted(url, options, counter)
        except ObjectNotFound:
            refuse_dangling_link(url)
            raise
        if opened is not None:
            opened.append(url)
        return loader

    records: list[Provenance] = []
    if shared_root is None:
        current, reason = check_artifact(urls, open_, want, published=published, records=records)
    else:
        from .shared import check_shared_ptd

        current, reason = check_artifact(
            urls[:1],
            open_,
            want,
            ptd_check=lambda pte, prov: check_shared_ptd(pte, prov, open_, shared_root),
            published=published,
            records=records,
        )
    if current and rate is not None:
        from ..backends.rating import below_optimal

        why = below_optimal(records[0].backends, *rate)
        if why is not None:
            return False, why
    return current, reason


def run_pair(task: PairTask) -> PairResult:
    """Do one pair; every failure is reported in the result, never raised."""
    from .retry import PAIR_ATTEMPTS, backoff, transient

    t0 = time.perf_counter()
    counter = [0]
    result = PairResult(task.model, task.device.name, task.destination, "failed")
    for attempt in range(1, PAIR_ATTEMPTS + 1):
        result.attempts = attempt
        try:
            unchanged: list[str] = []
            result.status, result.reason = _run(task, counter, unchanged)
            result.unspecialized = unchanged[0] if unchanged else None
            if task.xnnpack_cpu is not None:
                from .packing import make_packed

                made, result.xnnpack = make_packed(
                    task.destination,
                    task.device.name,
                    task.xnnpack_cpu,
                    task.storage_options,
                    counter,
                    task.xnnpack_timeout,
                    task.named,
                )
                if made and result.status == "skipped":
                    result.status = "done"  # the artifact was current, its file is new
            result.error = None
            break
        except Exception as exc:
            result.status = "failed"
            result.error = (
                f"{type(exc).__name__}: {exc}" if not isinstance(exc, PteStoreError) else (str(exc))
            )
            if attempt == PAIR_ATTEMPTS or not transient(exc):
                break
            time.sleep(backoff(attempt))  # a transient failure: the whole pair again
    result.seconds = time.perf_counter() - t0
    result.bytes = counter[0]
    return result


def _run(task: PairTask, counter: list[int], unchanged: list[str]) -> tuple[str, str]:
    from ..coordinator import specialize_pair

    urls = [task.destination] + ([task.ptd_destination] if task.ptd_destination else [])
    found: list[str] = []
    impls = [load_backend(spec) for spec in task.backends]
    # An artifact its backends rate below optimal for this device is made again (as
    # the plan said): rated here too, by the backends installed on this worker.
    rate = ({s.strip(): i for s, i in zip(task.backends, impls, strict=True)}, task.device)
    current, reason = check_destination(
        urls, task.storage_options, task.key, counter, task.shared_root, opened=found, rate=rate
    )
    if current:  # e.g. a retry after the first attempt had published
        from .holds import hold

        # reused, not written: held against gc until the run's index names it
        gone = hold(found, task.storage_options, task.named)
        if not gone:
            return "skipped", reason
        reason = f"current, but {gone[0]} is gone since: made again"
    versions = tuple(
        (spec.strip(), version_of(i, spec.strip()))
        for spec, i in zip(task.backends, impls, strict=True)
    )
    if versions != task.key.backends:
        raise PteStoreError(
            f"backend versions on this worker {list(versions)} differ from the planner's "
            f"{list(task.key.backends)}; install the same versions everywhere"
        )
    exists = not reason.startswith("no artifact")
    mode: PublishMode = "overwrite" if exists or task.ptd is not None else "create"
    ptd = None
    store = None
    if task.ptd is not None and task.ptd_destination is not None:
        ptd = (task.ptd, task.ptd_destination)
        if task.shared_root is not None:
            from .shared import SharedStore

            store = SharedStore(
                task.shared_root,
                task.storage_options,
                lambda url: open_counted(url, task.storage_options, counter),
                task.hold_shared,
            )
    try:
        report = specialize_pair(
            task.source,
            task.destination,
            ptd=ptd,
            options=pair_options(task.destination, task.storage_options),
            backends=list(task.backends),  # recorded as the job's SPECs
            mode=mode,
            device=task.device,
            provenance=ProvenanceRequest(
                sources=dict(task.sources),
                job=None if task.job is None else JobStamp(*task.job),
            ),
            allow_unchanged=True,  # a job publishes its artifact even if all declined
            loader_hook=lambda loader: CountingLoader(loader, counter),
            ptd_store=store,
        )
        # A .ptd found stored at its content address was not written again.
        counter[0] += sum(f.size_after for f in report.files if f.status != "stored")
        if report.unchanged_reason is not None:  # published all the same: said, not silent
            unchanged.append(report.unchanged_reason)
        outcome = "published"
        # The digests the run just published, by URL: a destination whose record names
        # the same one is the run's own file, not read and hashed again.
        by_role = {f.role: f.content_digest for f in report.files if f.status == "written"}
        digests = (by_role.get(role) for role in ("pte", "ptd")[: len(urls)])
        published = {
            url: digest for url, digest in zip(urls, digests, strict=True) if digest is not None
        }
    except AlreadyExists:
        outcome = "raced"  # another worker published first: verify what it left
        published = {}
    current, reason = check_destination(
        urls, task.storage_options, task.key, counter, task.shared_root, published
    )
    if not current:
        raise PteStoreError(
            f"{task.destination}: after {'publishing' if outcome == 'published' else 'a race'}, "
            f"the destination is not current ({reason}); another run with other inputs "
            "may have replaced it"
        )
    return "done", "published" if outcome == "published" else "published by another worker"
