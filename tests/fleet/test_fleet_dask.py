"""The same 51-pair job on a Dask ``LocalCluster`` (two worker processes, started
here) gives the same results as a local run, also when one worker is killed mid-run:
Dask reschedules its tasks, every pair ends done (or reported failed and done by the
rerun), each artifact equals what an in-process specialization of the same pair gives
(same container bytes, same provenance key), and ``gc`` leaves no multipart upload."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import distributed  # the [test] extra installs it: missing is an error, never a skip
import fsspec
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.fleet import PairResult, load_job, run_job
from ptestore.gc import collect_s3
from ptestore.provenance import read_provenance, read_trailer
from ptestore.storage.loaders import BytesLoader
from ptestore.testing.moto import MotoS3

from .fleetkit import statuses, upload_models, uploads, write_job

pytestmark = pytest.mark.s3


def _content(body: bytes) -> tuple[bytes, Any]:
    trailer = read_trailer(BytesLoader(body))
    assert trailer is not None
    prov = read_provenance(BytesLoader(body))
    assert prov is not None
    return body[: trailer.content_size], prov.key()


def test_dask_cluster_matches_the_pool_even_when_a_worker_dies(
    moto_s3: MotoS3, tmp_path: Path
) -> None:
    bucket = moto_s3.new_bucket()
    upload_models(moto_s3, bucket)
    endpoint = moto_s3.endpoint_url
    pool_job = load_job(write_job(tmp_path / "pool.toml", moto_s3, bucket, endpoint, prefix="pool"))
    dask_job = load_job(write_job(tmp_path / "dask.toml", moto_s3, bucket, endpoint, prefix="dask"))
    reference = run_job(pool_job, workers=2)
    assert set(statuses(reference).values()) == {"done"}

    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        with distributed.Client(cluster) as client:
            pids = client.run(os.getpid)
            assert len(pids) == 2
            victim = sorted(pids.values())[0]
            finished: list[PairResult] = []
            killed = threading.Event()

            def progress(result: PairResult) -> None:
                finished.append(result)
                if len(finished) == 8 and not killed.is_set():
                    os.kill(victim, signal.SIGKILL)  # mid-run: tasks are running on it
                    killed.set()

            t0 = time.perf_counter()
            result = run_job(dask_job, scheduler=cluster.scheduler_address, progress=progress)
            elapsed = time.perf_counter() - t0
            assert killed.is_set()
            # The nanny restarted the killed worker; Dask rescheduled what it held.
            assert victim not in client.run(os.getpid).values()
    finally:
        cluster.close()
    assert result.engine.startswith("dask tcp://") and elapsed > 0
    assert len(finished) == len(dask_job.pairs())
    failed = [p for p in result.pairs if p.status == "failed"]
    for p in failed:  # only Dask's own verdicts (KilledWorker, ...), never ptestore's
        assert p.error and p.error.startswith("Dask task failed: "), p
        assert "event loop" not in p.error, p
    # gc over the destination prefix removes what the killed worker left behind.
    collect_s3(f"s3://{bucket}/dask/", older_than=0, **moto_s3.storage_options)
    assert uploads(moto_s3, bucket) == []
    # Pairs the kill made fail (if any) complete on a rerun (skipped: the killed worker
    # had published it before its result could be fetched); then all are current.
    if failed:
        rerun = run_job(dask_job, workers=1)
        assert {k for k, v in statuses(rerun).items() if v in ("done", "skipped")} >= {
            (p.model, p.device) for p in failed
        }, [p.error for p in failed]
    again = run_job(dask_job, workers=1)
    assert set(statuses(again).values()) == {"skipped"}
    # Same results as a local run of each pair: same container bytes, same key.
    client = moto_s3.client()
    for got in result.pairs:
        fx = get_fixture(got.model)
        assert fx.pte_path is not None
        dst = f"memory://dask-reference/{got.device}/{got.model}.pte"
        ptd = (fx.ptd_path, dst[:-4] + ".ptd") if fx.ptd_path else None
        ptestore.specialize(
            fx.pte_path,
            dst,
            ptd=ptd,
            backends=list(dask_job.backends),
            device=dask_job.device(got.device),
            provenance=True,
        )
        want = fsspec.filesystem("memory").cat_file(dst)
        body = client.get_object(Bucket=bucket, Key=got.destination.split("/", 3)[3])
        assert _content(body["Body"].read()) == _content(want), got
