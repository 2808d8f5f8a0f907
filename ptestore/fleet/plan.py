"""What a fleet run would do: describe each model's sources once, look at each pair's
destination, and decide run or skip (and why)."""

from __future__ import annotations

import concurrent.futures as cf
from collections import Counter
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..backends.compat import version_of
from ..backends.registry import load_backend
from ..errors import BackendError, ConfigurationError, ObjectNotFound, PteStoreError
from ..provenance import ProvenanceKey, SourceInfo, describe_source
from .estimate import Estimate, estimate_pair, human_bytes
from .job import Job, Pair
from .packed_field import runtime_build
from .packing import packed_state
from .retry import transient
from .shared import shared_root
from .work import PairResult, PairTask, check_destination, open_counted

if TYPE_CHECKING:
    from ..backends.api import BackendInterface

__all__ = ["Plan", "PlannedPair", "backend_versions", "plan_job"]

#: Destinations checked at once while planning.
_CHECK_THREADS = 16


@dataclass
class PlannedPair:
    """One pair and what a run would do with it: ``action`` is ``"run"``, ``"skip"``
    or ``"fail"`` (its sources cannot be read, or its destination cannot for a reason
    other than its absence or a transient failure: a run would fail it)."""

    pair: Pair
    action: str
    reason: str
    task: PairTask | None
    #: Bytes the planner read for this pair (its share of the sources, the trailer).
    bytes: int = 0
    #: What running it is expected to cost (zero unless ``action`` is ``"run"``).
    estimate: Estimate = field(default_factory=Estimate)
    #: For a device that declares ``xnnpack_cpu``: the state of its packed-weight file.
    xnnpack: str | None = None
    #: For a pair to skip: the objects it relies on (its .pte, its .ptd or the shared
    #: one, its packed-weight file and record), held before the run starts
    #: (:mod:`.reuse`).
    relies: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.pair.model.name,
            "device": self.pair.device.name,
            "destination": self.pair.destination,
            "action": self.action,
            "reason": self.reason,
            "estimate": self.estimate.to_dict(),
        }

    def result(self, status: str, error: str | None = None) -> PairResult:
        """This pair's result when it did not run: ``"skipped"``, or ``"failed"`` with
        ``error`` (the planner's bytes counted)."""
        p = self.pair
        return PairResult(
            p.model.name,
            p.device.name,
            p.destination,
            status,
            error=error,
            bytes=self.bytes,
            reason=self.reason,
            xnnpack=self.xnnpack,
        )

    def lost(self, error: str) -> PairResult:
        """This pair's result when its run was lost (a worker died, a task failed, it
        ran too long): failed with ``error``, as a worker's result is before the runner
        adds the planner's bytes (counted once)."""
        r = self.result("failed", error)
        r.bytes = 0
        return r


@dataclass
class Plan:
    job: Job
    pairs: list[PlannedPair]

    def count(self, action: str) -> int:
        return sum(1 for p in self.pairs if p.action == action)

    @property
    def estimate(self) -> Estimate:
        """The estimated cost of every pair to run, summed (:mod:`.estimate`)."""
        total = Estimate()
        for p in self.pairs:
            total += p.estimate
        return total

    def render(self) -> str:
        width = max([len(p.pair.model.name) for p in self.pairs] + [5])
        dwidth = max([len(p.pair.device.name) for p in self.pairs] + [6])
        lines = [
            f"{'model':<{width}}  {'device':<{dwidth}}  action  {'client':>10}  "
            f"{'copied':>10}  {'requests':>8}  reason"
        ]
        for p in self.pairs:
            e = p.estimate
            lines.append(
                f"{p.pair.model.name:<{width}}  {p.pair.device.name:<{dwidth}}  "
                f"{p.action:<6}  {human_bytes(e.client_bytes):>10}  "
                f"{human_bytes(e.copy_bytes):>10}  {e.requests:>8}  {p.reason}"
            )
        lines.append(
            f"{len(self.pairs)} pairs: {self.count('run')} to run, {self.count('skip')} to skip"
            + (f", {self.count('fail')} failing" if self.count("fail") else "")
        )
        total = self.estimate
        lines.append(
            f"estimated for the pairs to run: {human_bytes(total.client_bytes)} through the "
            f"client, {human_bytes(total.copy_bytes)} copied by the S3 service, "
            f"{total.requests} S3 requests (estimates: backends that replace data move "
            "more through the client)"
        )
        return "\n".join(lines)


def backend_versions(specs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(spec, version)`` of each backend, as the provenance records them."""
    return _versions(_loaded(specs))


def _loaded(specs: tuple[str, ...]) -> list[tuple[str, BackendInterface]]:
    """Each backend loaded, with its SPEC as the provenance records it."""
    return [(spec.strip(), load_backend(spec)) for spec in specs]


def _versions(loaded: list[tuple[str, BackendInterface]]) -> tuple[tuple[str, str], ...]:
    return tuple((spec, version_of(impl, spec)) for spec, impl in loaded)


def plan_job(job: Job) -> Plan:
    """Decide, for every pair, whether a run does it (never writes anything).

    Raises :class:`~ptestore.errors.ConfigurationError` when a backend cannot be
    loaded; a model whose source cannot be read makes its pairs ``"fail"``."""
    try:
        loaded = _loaded(job.backends)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{job.path}: backends: {exc}") from exc
    versions = _versions(loaded)
    impls = dict(loaded)  # what rates a current artifact for its pair's device
    from ..journal import recover_if_local

    described: dict[str, dict[str, SourceInfo] | str] = {}
    read: dict[str, int] = {}
    for model in job.models:
        counter = [0]
        try:
            # a local source an in-place run was interrupted on: completed from its
            # journal before it is described (the key is of the bytes the run reads)
            recover_if_local(model.source)
            infos = {"pte": _describe(model.source, job, counter)}
            if model.ptd is not None:
                infos["ptd"] = _describe(model.ptd, job, counter)
            described[model.name] = infos
        except PteStoreError as exc:
            described[model.name] = str(exc)
        read[model.name] = counter[0]
    # The ExecuTorch build a current packed-weight file must have been made with: this
    # machine's, when it has one (the workers compare their own before they skip one).
    build = runtime_build() if job.xnnpack_cpu else None
    pairs = job.pairs()
    per_model = Counter(p.model.name for p in pairs)

    def decide(pair: Pair) -> PlannedPair:
        share = read[pair.model.name] // max(1, per_model[pair.model.name])
        entry = described[pair.model.name]
        if isinstance(entry, str):
            return PlannedPair(pair, "fail", f"cannot read the source: {entry}", None, share)
        infos = entry
        key = ProvenanceKey(
            infos["pte"].sha256,
            infos["ptd"].sha256 if "ptd" in infos else None,
            versions,
            (pair.device.name, pair.device.digest()),
        )
        task = PairTask(
            model=pair.model.name,
            device=pair.device,
            source=pair.model.source,
            ptd=pair.model.ptd,
            destination=pair.destination,
            ptd_destination=pair.ptd_destination,
            backends=job.backends,
            storage_options=dict(job.storage_options),
            sources=infos,
            key=key,
            job=(job.stamp_path, job.sha256) if job.sha256 else None,
            shared_root=shared_root(job.destination) if pair.model.ptd else None,
            xnnpack_cpu=pair.xnnpack_cpu,
            xnnpack_timeout=job.xnnpack_timeout,
        )
        counter = [0]
        opened: list[str] = []  # the objects the checks found
        urls = [pair.destination] + ([pair.ptd_destination] if pair.ptd_destination else [])
        try:
            current, reason = check_destination(
                urls,
                job.storage_options,
                key,
                counter,
                task.shared_root,
                opened=opened,
                rate=(impls, pair.device),
            )
        except BackendError as exc:  # a backend that cannot rate it: a run would fail too
            reason = f"cannot rate the destination: {exc}"
            return PlannedPair(pair, "fail", reason, task, share + counter[0])
        except PteStoreError as exc:
            reason = f"cannot read the destination: {exc}"
            if not (isinstance(exc, ObjectNotFound) or transient(exc)):
                # A run would fail it the same way (a directory there, access refused).
                return PlannedPair(pair, "fail", reason, task, share + counter[0])
            current = False
        why: str | None = None
        if current and pair.xnnpack_cpu is not None:
            try:
                current, why = packed_state(
                    pair.destination, pair.xnnpack_cpu, build, job.storage_options, opened
                )
            except PteStoreError as exc:
                current, why = False, f"cannot read its XNNPACK packed-weight record: {exc}"
            reason = f"{reason}; {why}" if current else f"current, but {why}"
        planned = PlannedPair(pair, "skip" if current else "run", reason, task, share + counter[0])
        planned.xnnpack = why
        if current:
            planned.relies = tuple(dict.fromkeys(opened))
        planned.estimate = estimate_pair(task, planned.action, reason, job)
        return planned

    # Destination checks are small ranged reads: overlap their latency.
    with cf.ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:
        out = list(pool.map(decide, pairs))
    return Plan(job, out)


def _describe(url: str, job: Job, counter: list[int]) -> SourceInfo:
    loader = open_counted(url, job.storage_options, counter)
    try:
        return describe_source(loader, url)
    finally:
        loader.close()
