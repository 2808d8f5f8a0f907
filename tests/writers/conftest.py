"""Fixtures for the writer tests: one moto S3 server per session, a bucket per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ptestore.testing.moto import MotoS3, moto_s3_server


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    with moto_s3_server(min_part_size=1) as server:
        yield server


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    return moto_s3.new_bucket()


@pytest.fixture
def s3_client(moto_s3: MotoS3) -> Any:
    return moto_s3.client()


@pytest.fixture(scope="session", autouse=True)
def _quiet_moto_logs() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
