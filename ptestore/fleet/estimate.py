"""What a planned pair is expected to cost: bytes through the client, bytes the S3
service copies itself, and S3 requests (estimates, from the sizes the planner read).

The model follows what a pair does (docs/fleet.md, "What a plan estimates"): the
destination is checked (its trailer), every source byte is read once for the output's
digest, the output is written (unchanged parts of a large S3 source on the same service
copied by the service, ``UploadPartCopy``), and the published files are checked again.
It assumes the output is as large as its source and that the backends replace nothing
(what they replace goes through the client instead of being copied); request counts are
exact for sources of at most 1 MiB (read whole: ``WHOLE_READ_LIMIT``) and approximate
beyond (one read per 8 MiB chunk and per part).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._dataclass import dataclass
from ..storage.routing import options_for_loader
from ..storage.types import split_url
from .job import pair_options

if TYPE_CHECKING:
    from .job import Job
    from .work import PairTask

__all__ = ["Estimate", "estimate_pair", "human_bytes"]

#: Options that decide an S3 client's endpoint and credentials (a service-side copy
#: needs the loader's and the writer's to agree).
_IDENTITY = ("endpoint_url", "key", "secret", "token", "anon", "profile", "client_kwargs")
_TAIL = 4096  # a trailer check reads at most the last 4 KiB
_CHUNK = 8 << 20  # reads of large sources (the digest's chunks)
_WHOLE = 1 << 20  # a remote source this small is read whole (storage/loaders.py)
_DEFAULT_PART = 8 << 20  # the S3 writer's default part size
_MIN_PART = 5 << 20  # S3 copies a range only of more than this


@dataclass(frozen=True)
class Estimate:
    """Estimated cost of one pair (or of a plan's pairs, summed with ``+``)."""

    #: Bytes read and written through this client (what ``fleet run`` reports).
    client_bytes: int = 0
    #: Bytes the S3 service copies from the source itself (never through the client).
    copy_bytes: int = 0
    #: S3 requests (HEAD, GET, LIST, PUT and the multipart calls).
    requests: int = 0

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(
            self.client_bytes + other.client_bytes,
            self.copy_bytes + other.copy_bytes,
            self.requests + other.requests,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "client_bytes": self.client_bytes,
            "server_copy_bytes": self.copy_bytes,
            "s3_requests": self.requests,
        }


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _s3(url: str) -> bool:
    return split_url(url)[0] == "s3"


def _same_service(src: str, dst: str, job: Job) -> bool:
    if not (_s3(src) and _s3(dst)):
        return False
    read = options_for_loader(src, job.storage_options)
    write = pair_options(dst, job.storage_options).for_writer(dst)
    return all(read.get(k) == write.get(k) for k in _IDENTITY)


def _file(src: str, dst: str, size: int, job: Job, *, shared: bool = False) -> Estimate:
    """One output file made from a source of ``size`` bytes; ``shared``: a .ptd stored
    under its content address (``fleet/shared.py``), assumed not stored yet."""
    part = int(
        pair_options(dst, job.storage_options).for_writer(dst).get("part_size", _DEFAULT_PART)
    )
    whole = _s3(src) and size <= _WHOLE
    copy = 0
    nparts = max(1, -(-size // part))
    if _same_service(src, dst, job) and size > max(part, _WHOLE):
        # Part 1 holds the new metadata; a short last part is uploaded too.
        copy = sum(n for i in range(1, nparts) if (n := min(part, size - i * part)) > _MIN_PART)
    uploaded = size - copy
    # Reads: the trailer's tail, every byte for the digest, the uploaded parts' unchanged
    # bytes again when writing (not for a source held in memory); writes: the uploaded
    # bytes; after publishing, the destination's trailer.
    # A shared .ptd has no trailer: nothing of it is read back after publishing.
    reads = min(size, _TAIL) + size + (0 if whole else uploaded)
    client = reads + uploaded + (0 if shared else min(size, _TAIL))
    requests = 0
    if _s3(src):
        chunks = -(-size // _CHUNK)
        gets = 2 if whole else 3 + chunks + (nparts if copy else chunks)
        requests += 2 + gets  # HEAD when opened and before publishing, the reads
    if _s3(dst):
        if nparts == 1:
            requests += 2  # PutObject, HEAD (verify)
        else:
            requests += nparts + 4  # Create, gc marker part, parts, Complete, HEAD
        if shared:
            # Looked for at its address first (HEAD, and s3fs's LIST for an absent
            # object); checked after publishing by HEAD and stored checksum (no trailer).
            requests += 2 + 2
        else:
            # check after publishing: HEAD, trailer GET (a record naming the digest the
            # run published is not checked against the stored checksum again)
            requests += 2
    return Estimate(client, copy, requests)


def estimate_pair(task: PairTask | None, action: str, reason: str, job: Job) -> Estimate:
    """The :class:`Estimate` of a planned pair: ``action`` and ``reason`` as the plan
    decided them (zero unless ``action`` is ``"run"``)."""
    if action != "run" or task is None:
        return Estimate()
    total = _file(task.source, task.destination, task.sources["pte"].size, job)
    if task.ptd is not None and task.ptd_destination is not None and "ptd" in task.sources:
        # Every fleet .ptd goes to the job's content-addressed store (its destination
        # here is the store's directory), as if this pair were the first to store it.
        total += _file(task.ptd, task.ptd_destination, task.sources["ptd"].size, job, shared=True)
    # The check before running reads the .pte destination's trailer (an absent one: a
    # HEAD, and s3fs's LIST to tell a missing object from a directory).
    exists = not reason.startswith("no artifact")
    check = Estimate(_TAIL if exists else 0, 0, 2 if _s3(task.destination) else 0)
    return total + check
