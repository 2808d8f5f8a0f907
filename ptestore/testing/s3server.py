"""What the S3 tests need from a test server, whichever one it is (moto, SeaweedFS)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["S3TestServer"]


class S3TestServer(Protocol):
    """A running S3 endpoint: :class:`~ptestore.testing.moto.MotoS3` or
    :class:`~ptestore.testing.seaweedfs.SeaweedS3`."""

    @property
    def endpoint_url(self) -> str: ...

    @property
    def min_part_size(self) -> int:
        """The smallest non-last multipart part the server accepts (AWS S3: 5 MiB)."""
        ...

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs-style options (endpoint and credentials) for writers and loaders."""
        ...

    def client(self) -> Any:
        """A plain boto3 client with botocore retries off."""
        ...

    def new_bucket(self) -> str:
        """Create and return a fresh, uniquely named bucket."""
        ...
