"""The writer contract on S3Writer against both S3 test servers (moto, SeaweedFS)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ptestore.testing.s3server import S3TestServer
from ptestore.testing.writer_contract import WriterContract
from ptestore.writers import DataWriter, open_writer
from ptestore.writers.base import Versioned
from ptestore.writers.s3 import MIN_PART_SIZE, S3Writer
from ptestore.writers.versions import read_versioned

pytestmark = pytest.mark.s3

MOTO_IF_MATCH_COMPLETE = "moto ignores If-Match on CompleteMultipartUpload"

PART = MIN_PART_SIZE  # S3's smallest part; the large-output test spans 4 parts


class TestS3Contract(WriterContract):
    model_examples = 10
    large_size = 3 * PART + 12345
    staged_size = 3 * PART + 1  # four parts: a multipart upload that discard must abort
    model_span = 3 * PART
    model_boundary = PART
    racers = 4
    options: dict[str, Any] = {"part_size": PART, "max_concurrency": 3}  # noqa: RUF012

    @pytest.fixture(autouse=True)
    def _bucket(self, s3_server: S3TestServer, s3_bucket: str, s3_client: Any) -> None:
        self.server = s3_server
        self.bucket = s3_bucket
        self.client = s3_client
        part = self.options.get("part_size")
        if part is not None and part < s3_server.min_part_size:
            # A real S3 server refuses parts under 5 MiB: use 5 MiB parts, and a large
            # output that still spans several of them (3 and a bit).
            minimum = s3_server.min_part_size
            self.options = {**self.options, "part_size": minimum}
            self.large_size = 3 * minimum + 12345  # type: ignore[misc]

    def new_dest(self) -> str:
        return f"s3://{self.bucket}/models/{uuid.uuid4().hex}.pte"

    def make_writer(self, dest: str) -> DataWriter:
        w = open_writer(dest, **self.server.storage_options, **self.options)
        assert isinstance(w, S3Writer)
        return w

    def read_versioned(self, dest: str) -> Versioned:
        return read_versioned(dest, **self.server.storage_options)

    @pytest.mark.s3_xfail("moto", reason=MOTO_IF_MATCH_COMPLETE)
    def test_if_match_conflict_staged(self, dest: str) -> None:
        super().test_if_match_conflict_staged(dest)

    def _key(self, dest: str) -> str:
        return dest.split("/", 3)[3]

    def get(self, dest: str) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._key(dest))[
                "Body"
            ].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body

    def put(self, dest: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(dest), Body=data)

    def leftovers(self, dest: str) -> list[str]:
        uploads = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self._key(dest))
        return [u["UploadId"] for u in uploads.get("Uploads", [])]

    def at_commit_operation(
        self, writer: DataWriter, action: Callable[[], None]
    ) -> contextlib.AbstractContextManager[None]:
        """Run ``action`` when ``writer``'s ``PutObject`` or ``CompleteMultipartUpload``
        is about to be sent, after every check the writer made (an async botocore hook:
        the action runs in a thread while the shared event loop keeps serving it)."""
        assert isinstance(writer, S3Writer)
        fired: list[bool] = []

        async def before_send(**_: Any) -> None:
            if not fired:
                fired.append(True)
                await asyncio.to_thread(action)

        @contextlib.contextmanager
        def hooked() -> Iterator[None]:
            events = writer.client.meta.events
            for op in ("PutObject", "CompleteMultipartUpload"):
                events.register(f"before-send.s3.{op}", before_send)
            try:
                yield
            finally:
                for op in ("PutObject", "CompleteMultipartUpload"):
                    events.unregister(f"before-send.s3.{op}", before_send)

        return hooked()


class TestS3SinglePartContract(TestS3Contract):
    """Default 8 MiB parts: most outputs go up as one conditional PutObject."""

    model_examples = 5
    large_size = (16 << 20) + 4321
    staged_size = (16 << 20) + 1  # three 8 MiB parts
    model_span = 2 * (8 << 20)
    model_boundary = 8 << 20
    options: dict[str, Any] = {}  # noqa: RUF012
