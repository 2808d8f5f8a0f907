"""Fixtures for the writer tests: a bucket per test on the `s3_server` under test."""

from __future__ import annotations

from typing import Any

import pytest

from ptestore.testing.s3server import S3TestServer


@pytest.fixture
def s3_bucket(s3_server: S3TestServer) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def s3_client(s3_server: S3TestServer) -> Any:
    return s3_server.client()


@pytest.fixture(scope="session", autouse=True)
def _quiet_moto_logs() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
