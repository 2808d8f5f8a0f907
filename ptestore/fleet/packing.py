"""A fleet run makes XNNPACK packed-weight files on the workers whose CPU is the device's.

A device that declares its CPU fingerprint in the job file (``xnnpack_cpu``) asks for
XNNPACK's packed-weight file of each of its artifacts (:mod:`ptestore.xnnpack`: made by
the stock runtime, verified bit for bit, bound to the artifact, the ExecuTorch build and
the CPU). The file packs weights for the kernels of one CPU, so it is made only where
the CPU is that one:

- before any pair runs, :func:`check_packers` finds, for every such device of a pair to
  run, the workers with its fingerprint and the ExecuTorch runtime (on Dask, asked of
  every worker with :func:`worker_cpu`; inline and on the process pool, this machine),
  and refuses the run (one :class:`~.job.JobError`, exit 2) naming the device, its
  fingerprint and what the workers have, when there is none; before the run holds
  anything (:mod:`.reuse`);
- the pair's task then runs only there (Dask: restricted to those workers' hosts), and
  :func:`make_packed`, after the artifact is published (or found current), downloads it
  (verified, :func:`~.fetch.fetch`), makes the file with
  :func:`ptestore.xnnpack.make_cache`, stores it beside the artifact (created
  exclusively; an object already there is accepted only with the same bytes) and then
  the record (:mod:`.packed`) with the file's chunk digests (:mod:`.packed_chunks`: a
  device holding an earlier version's file downloads only the chunks that differ). The
  record is bound to the artifact it fetched (the trailer of the bytes downloaded), and
  published only while the destination still holds that artifact: one replaced by
  another run meanwhile gets no record (the next run makes its file). A
  refusal by the runtime (a graph it cannot cache, a crash) is recorded instead: the
  artifact is published and served all the same. A failure that may pass (each run of
  the runtime has the job's ``xnnpack_timeout`` seconds, by default
  :data:`ptestore.xnnpack.refusal.DEFAULT_TIMEOUT`; a kill from
  outside) is not recorded: the next run makes the file again.

:func:`packed_state` says whether a pair's file is current (the record bound to the
artifact, the device's CPU, the ExecuTorch build when it is known, the file there at its
size): the planner skips a pair only then.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import AlreadyExists, IntegrityError, PackedWeightsRefused, PteStoreError
from ..storage.loaders import open_loader
from ..storage.routing import options_for_loader
from ..storage.types import absolute_local
from .holds import hold
from .job import JobError, pair_options, ptd_beside
from .packed import (
    RECORD_FORMAT,
    RECORD_VERSION,
    bound_to,
    file_url,
    read_record,
    record_url,
)

if TYPE_CHECKING:
    from ..provenance.chunks import ChunkDigests

__all__ = [
    "check_beside",
    "check_packers",
    "make_packed",
    "packed_state",
    "worker_cpu",
]

_CHUNK = 8 << 20


def worker_cpu() -> dict[str, str | None]:
    """What this process can make files for: its CPU fingerprint, and why it cannot make
    any (``"runtime"``: no ExecuTorch runtime, or its native piece cannot be built here)
    or None. Run on each Dask worker (the native piece is built once per wheel, then
    found in the user cache)."""
    from ..errors import ConfigurationError
    from ..xnnpack.identity import cpu_fingerprint
    from ..xnnpack.native import build_shim

    try:
        build_shim()
        missing = None
    except ConfigurationError as exc:
        missing = str(exc)
    return {"cpu": cpu_fingerprint(), "runtime": missing}


def check_packers(
    job_path: str, wanted: Iterable[tuple[str, str]], have: dict[str, dict[str, str | None]]
) -> dict[str, list[str]]:
    """For every ``(device, fingerprint)`` of the pairs to run that ask for packed-weight
    files, the workers (keys of ``have``: what :func:`worker_cpu` answered there) that
    can make them, by fingerprint; a :class:`JobError` naming the first device none can
    serve, its fingerprint and what the workers have."""
    able: dict[str, list[str]] = {}
    for where, info in have.items():
        if info.get("runtime") is None and info.get("cpu"):
            able.setdefault(str(info["cpu"]), []).append(where)
    for device, cpu in wanted:
        if cpu in able:
            continue
        groups: dict[str, list[str]] = {}
        for where, info in have.items():
            what = repr(info.get("cpu"))
            if info.get("runtime") is not None:
                what += f" without the ExecuTorch runtime ({info['runtime']})"
            groups.setdefault(what, []).append(where)
        described = "; ".join(f"{w} on {', '.join(sorted(ws))}" for w, ws in sorted(groups.items()))
        raise JobError(
            f"{job_path}: device {device!r} declares xnnpack_cpu {cpu!r}, and no "
            "worker of this run has that CPU and the ExecuTorch runtime to make its XNNPACK "
            f"packed-weight files (the workers have {described or 'nothing'}); run it "
            "where such a worker is, or remove xnnpack_cpu from the device"
        )
    return able


def _artifact(destination: str, options: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The index file entry of the artifact at ``destination`` and its .ptd's SHA-256."""
    from .index_entry import artifact_entry

    pte, prov = artifact_entry(destination, options)
    return pte, None if prov.ptd_output is None else prov.ptd_output.sha256


def packed_state(
    destination: str,
    cpu: str,
    build: dict[str, str] | None,
    options: dict[str, Any],
    opened: list[str] | None = None,
) -> tuple[bool, str]:
    """``(current, why)`` of the packed-weight file of the (current) artifact at
    ``destination`` for the CPU ``cpu`` and the ExecuTorch ``build`` (None: not
    compared): its record is bound to the artifact and names that CPU and build, and
    its file is there at its recorded size, or the runtime's refusal is recorded (not
    one that may pass: :func:`ptestore.xnnpack.refusal.transient_reason`). ``opened``:
    the record and the file found are appended to it."""
    from ..xnnpack.refusal import transient_reason

    record = read_record(destination, options)
    if record is None:
        return False, f"no XNNPACK packed-weight record at {record_url(destination)}"
    if opened is not None:
        opened.append(record_url(destination))
    if not bound_to(record, *_artifact(destination, options)):
        return False, "its XNNPACK packed-weight file was made for an earlier artifact"
    field = record["xnnpack"]
    if field.get("cpu") != cpu:
        return False, f"its XNNPACK packed-weight file is for the CPU {field.get('cpu')!r}"
    if build is not None and field.get("executorch") != build:
        made = field.get("executorch") or {}
        return False, (
            f"its XNNPACK packed-weight file was made with ExecuTorch {made.get('version')} "
            f"({made.get('git_version')}), not {build['version']} ({build['git_version']})"
        )
    if field.get("refused"):
        if transient_reason(str(field["refused"])):  # recorded by an earlier version
            return False, f"its XNNPACK refusal may pass, made again: {field['refused']}"
        return True, f"XNNPACK packed weights refused by the runtime: {field['refused']}"
    url = str(field.get("url"))
    try:
        loader = open_loader(url, **options_for_loader(url, options, "dst"))
    except PteStoreError as exc:
        return False, f"its XNNPACK packed-weight file cannot be read: {exc}"
    try:
        size = loader.size()
    finally:
        loader.close()
    if size != field.get("size"):
        return False, f"{url}: {size} bytes, its record names {field.get('size')}"
    if opened is not None:
        opened.append(url)
    return True, "XNNPACK packed-weight file current"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _store(path: str, url: str, sha256: str, options: dict[str, Any]) -> ChunkDigests:
    """Store the file ``path`` at ``url``, created exclusively: an object already there
    (another worker's) is accepted only with these bytes, never overwritten. Returns the
    file's chunk digests (:mod:`.packed_chunks`), hashed as it is read for the upload."""
    from ..provenance.chunks import ChunkHasher
    from ..provenance.digest import content_digest
    from ..writers import open_writer

    hasher = ChunkHasher(os.path.getsize(path))
    w = open_writer(url, **pair_options(url, options).for_writer(url))
    try:
        with open(path, "rb") as f:
            offset = 0
            while data := f.read(_CHUNK):
                hasher.update(data)
                w.write(data, offset)
                offset += len(data)
        w.publish("create")
        return hasher.result()
    except AlreadyExists:
        pass
    finally:
        w.discard()
    loader = open_loader(url, **options_for_loader(url, options, "dst"))
    try:
        got = content_digest(loader, loader.size(), like="sha256:" + sha256).sha256
    finally:
        loader.close()
    if got != "sha256:" + sha256:
        raise IntegrityError(
            f"{url}: another object is stored under this name ({got}; the file made here "
            f"has sha256:{sha256}); a packed-weight file is never overwritten: remove it "
            "and run again"
        )
    return hasher.result()


def _publish_record(url: str, record: dict[str, Any], options: dict[str, Any]) -> None:
    from ..writers import open_writer

    w = open_writer(url, **pair_options(url, options).for_writer(url))
    try:
        w.write(json.dumps(record, indent=1, sort_keys=True).encode(), 0)
        w.publish("overwrite")
    finally:
        w.discard()


def make_packed(
    destination: str,
    device: str,
    cpu: str,
    opts: dict[str, Any],
    counter: list[int],
    timeout: float | None = None,
    named: Collection[tuple[str, str]] | None = None,
) -> tuple[bool, str]:
    """The packed-weight file of the artifact at ``destination`` (of ``device``, which
    declares the CPU ``cpu``), made when it is not current (see the module); ``(made or
    refused now, why)``. Runs on a worker with the device's CPU; ``counter[0]`` counts
    the bytes it moves; ``timeout``: seconds for each run of the runtime (the job's
    ``xnnpack_timeout``; None: :data:`~ptestore.xnnpack.refusal.DEFAULT_TIMEOUT`);
    ``named``: what the pair's live index entry names (a current file among them is not
    held: gc keeps it)."""
    from ..xnnpack import Identity, make_cache
    from ..xnnpack.identity import cpu_fingerprint, file_sha256
    from ..xnnpack.native import executorch_build
    from ..xnnpack.refusal import DEFAULT_TIMEOUT
    from ..xnnpack.workdirs import held_work_dir
    from .fetch import fetch

    build = executorch_build()
    found: list[str] = []
    current, why = packed_state(destination, cpu, build.to_json(), opts, found)
    # reused, not made: held against gc until the run's index names it (:mod:`.holds`)
    if current and not hold(found, opts, named):
        return False, why
    here = cpu_fingerprint()
    if here != cpu:
        raise PteStoreError(
            f"{destination}: this worker (process {os.getpid()} of "
            f"{socket.gethostname()}) has the CPU {here!r}, device {device!r} "
            f"declares {cpu!r}: its XNNPACK packed-weight file is made only where the CPU "
            "is the device's"
        )
    # a scratch directory a killed worker's next run collects (not a bare mkdtemp)
    with held_work_dir() as work:
        pte = os.path.join(work, "model.pte")
        got = fetch(destination, pte, storage_options=opts)
        counter[0] += sum(int(f["size"]) for f in got.files)
        ptd = ptd_beside(pte) if len(got.files) > 1 else None
        # bound to the bytes fetched (their trailer), not to what the URL holds now
        entry, ptd_sha256 = _artifact(pte, {})
        entry["url"] = absolute_local(destination)
        identity = Identity.of(file_sha256(pte), None if ptd is None else file_sha256(ptd), build)
        field: dict[str, Any] = {
            "url": None,
            "size": None,
            "sha256": None,
            "entries": None,
            "cpu": identity.cpu,
            "executorch": build.to_json(),
            "artifact_sha256": {
                "pte": "sha256:" + identity.pte_sha256,
                "ptd": None if identity.ptd_sha256 is None else "sha256:" + identity.ptd_sha256,
            },
            "refused": None,
            "chunks_root": None,
            "made": _now(),
        }
        chunks = None
        try:
            made = make_cache(
                pte,
                ptd=ptd,
                directory=os.path.join(work, "xnnpack"),
                pte_sha256=identity.pte_sha256,
                ptd_sha256=identity.ptd_sha256,
                timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
            )
        except PackedWeightsRefused as exc:
            if exc.transient:  # not recorded: the next run makes it again
                return False, f"XNNPACK packed-weight file not made (tried again next run): {exc}"
            field["refused"] = exc.reason
            why = f"XNNPACK packed weights refused by the runtime (recorded): {exc.reason}"
        else:
            url = file_url(destination, identity.name)
            chunks = _store(str(made.path), url, made.sha256, opts)
            counter[0] += made.size
            field.update(url=url, size=made.size, sha256="sha256:" + made.sha256)
            field.update(entries=made.entries, chunks_root=chunks.digest)
            why = f"XNNPACK packed-weight file made: {url}"
        record = {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "pte": entry,
            "ptd_sha256": ptd_sha256,
            "xnnpack": field,
        }
        if chunks is not None:  # what a device's delta delivery checks (.packed_chunks)
            record["chunks"] = chunks.to_dict()
        if not bound_to(record, *_artifact(destination, opts)):
            return False, (
                f"XNNPACK packed-weight file not recorded (tried again next run): the "
                f"artifact at {destination} was replaced while it was made"
            )
        _publish_record(record_url(destination), record, opts)
        return True, why


def check_beside(
    pte_url: str, options: dict[str, Any], *, quick: bool = False, cpu: str | None = None
) -> tuple[list[tuple[str, str]], str | None]:
    """``ptestore verify``'s check of the packed-weight file beside the artifact at
    ``pte_url`` (:mod:`.packed`'s layout): its record is bound to this artifact, made
    for ``cpu`` (the job's ``xnnpack_cpu``, when given: then a missing one is stale
    too), and its file has the recorded size and (unless ``quick``) SHA-256.
    ``(stale findings as (field, message), the file's URL or None)``; a file whose bytes
    are not its record's is a :class:`FormatError`, one that is gone
    :class:`~ptestore.errors.ObjectNotFound` (invalid)."""
    from ..errors import FormatError
    from ..provenance.digest import content_digest

    record = read_record(pte_url, options)
    where = record_url(pte_url)
    if record is None:
        if cpu is None:
            return [], None
        return [
            (
                "xnnpack",
                f"no XNNPACK packed-weight file beside it (no {where}); the job's device "
                f"declares xnnpack_cpu {cpu!r}",
            )
        ], None
    if not bound_to(record, *_artifact(pte_url, options)):
        return [("xnnpack.artifact", f"{where}: made for another artifact at this URL")], None
    field = record["xnnpack"]
    found: list[tuple[str, str]] = []
    if cpu is not None and field.get("cpu") != cpu:
        found.append(
            (
                "xnnpack.cpu",
                f"its packed-weight file was made for the CPU {field.get('cpu')!r}, the "
                f"job's device declares {cpu!r}",
            )
        )
    if field.get("refused"):
        return found, None
    url = str(field.get("url"))
    loader = open_loader(url, **options_for_loader(url, options, "dst"))
    try:
        size = loader.size()
        if size != field.get("size"):
            raise FormatError(url, "size", size, f"{field.get('size')} (its record {where})")
        if not quick:
            want = field.get("sha256")
            got = content_digest(loader, size, like=want if isinstance(want, str) else None).sha256
            if got != want:
                raise FormatError(
                    url, "SHA-256", got, f"{field.get('sha256')} (its record {where})"
                )
    finally:
        loader.close()
    return found, url
