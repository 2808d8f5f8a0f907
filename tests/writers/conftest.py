"""Fixtures for the writer tests: one moto S3 server per session, a bucket per test."""

from __future__ import annotations

from typing import Any

import pytest

from ptestore.testing.moto import MotoS3


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
