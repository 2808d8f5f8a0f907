"""A real S3 endpoint for tests: moto's HTTP server on 127.0.0.1, on a free port.

``S3_UPLOAD_PART_MIN_SIZE`` (moto's 5 MiB minimum part size) is read when the server
handles requests in this process; set it before starting the server to test multipart
uploads with small parts. :class:`~ptestore.writers.S3Writer` itself refuses parts under
S3's 5 MiB; :func:`small_s3_parts` lowers that floor for a test whose payloads are too
small to span several 5 MiB parts (test-only: real S3 rejects such uploads at Complete).

moto checks a write's condition (``If-None-Match: *``, ``If-Match``) and then writes,
with nothing between the two: two conditional ``PutObject`` racing on one key could
both succeed (seen once under load: two winners of a create race), where S3 lets one
through and refuses the other. The server here takes conditional writes one at a time
(:func:`_conditional_writes_in_turn`), as S3 decides them; unconditional requests are
not serialized.
"""

from __future__ import annotations

import os
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from .._dataclass import dataclass

__all__ = ["MotoS3", "moto_s3_server", "small_s3_parts"]


@dataclass(frozen=True)
class MotoS3:
    """A running moto server and the storage options that reach it."""

    name: ClassVar[str] = "moto"

    endpoint_url: str
    #: The smallest non-last multipart part the server accepts (AWS S3: 5 MiB).
    min_part_size: int = 5 << 20

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs-style options (throwaway credentials) for writers and loaders."""
        return {
            "endpoint_url": self.endpoint_url,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def client(self) -> Any:
        """A plain boto3 client (the tests' backdoor; botocore retries off)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        )

    def new_bucket(self) -> str:
        """Create and return a fresh, uniquely named bucket."""
        name = f"ptestore-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def reset(self) -> None:
        """Forget every bucket and upload (moto's state is process-global)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=30):
            pass


@contextmanager
def moto_s3_server(min_part_size: int | None = 1) -> Iterator[MotoS3]:
    """Run ``moto.server.ThreadedMotoServer`` on 127.0.0.1 (port 0) for the duration.

    ``min_part_size`` lowers moto's minimum multipart part size (``None`` keeps 5 MiB).
    """
    if min_part_size is not None:
        os.environ["S3_UPLOAD_PART_MIN_SIZE"] = str(min_part_size)
        os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(16 << 20))
    if min_part_size is not None:  # moto reads the variable once, at import
        import moto.s3.models

        setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", min_part_size)  # noqa: B010
    server = _server_class()(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield MotoS3(f"http://{host}:{port}", min_part_size or (5 << 20))
    finally:
        server.stop()


def _conditional_writes_in_turn(app: Any) -> Any:
    """The WSGI application ``app`` with its conditional writes (a PUT or POST with
    ``If-None-Match`` or ``If-Match``: PutObject, CompleteMultipartUpload) handled one
    at a time, each condition checked and its write made before the next is looked at."""
    import threading

    lock = threading.Lock()

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        conditional = "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
        if conditional and environ.get("REQUEST_METHOD") in ("PUT", "POST"):
            with lock:
                return list(app(environ, start_response))  # the write is done in here
        return app(environ, start_response)

    return application


def _server_class() -> type:
    """moto's threaded server whose application takes conditional writes in turn."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(
                self._ip_address,
                self._port,
                _conditional_writes_in_turn(app),
                True,
                request_handler=MotoRequestHandler,
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return Server


@contextmanager
def small_s3_parts(minimum: int = 1) -> Iterator[None]:
    """Test-only: let :class:`~ptestore.writers.S3Writer` take parts from ``minimum``
    bytes (S3's floor is 5 MiB) while the block runs; against moto started with a
    lowered ``min_part_size`` only."""
    from ..writers.s3 import config

    saved = config.MIN_PART_SIZE
    config.MIN_PART_SIZE = minimum
    try:
        yield
    finally:
        config.MIN_PART_SIZE = saved
