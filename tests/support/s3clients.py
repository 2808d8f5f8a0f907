"""A boto3 client of an S3 test server (moto or SeaweedFS) that uploads without a
checksum: what an old SDK or another tool does, and ptestore's own clients never do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["no_checksum_client"]


def no_checksum_client(opts: Mapping[str, Any]) -> Any:
    """A boto3 client of the server whose ``storage_options`` are ``opts`` (its
    ``endpoint_url``, ``key`` and ``secret``; region us-east-1) that sends a checksum
    only where an operation requires one (``request_checksum_calculation=
    "when_required"``): a ``put_object`` through it is an upload without a checksum."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=opts["endpoint_url"],
        aws_access_key_id=opts["key"],
        aws_secret_access_key=opts["secret"],
        region_name="us-east-1",
        config=Config(request_checksum_calculation="when_required"),
    )
