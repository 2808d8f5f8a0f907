"""The ``[storage_options]`` tables of a fleet job file that reaches an S3 test server
(moto or SeaweedFS: a ``storage_options`` dict with ``endpoint_url``, ``key`` and
``secret``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["s3_options_toml"]


def s3_options_toml(opts: Mapping[str, Any], *, endpoint: str | None = None, more: str = "") -> str:
    """The job-file text of ``opts``' connection: its endpoint (or ``endpoint``, e.g. a
    proxy's), key and secret, region us-east-1, and the ``[storage_options]`` lines
    ``more`` (each ending in a newline)."""
    url = opts["endpoint_url"] if endpoint is None else endpoint
    return (
        f'[storage_options]\nendpoint_url = "{url}"\n{more}'
        f'key = "{opts["key"]}"\nsecret = "{opts["secret"]}"\n'
        '[storage_options.client_kwargs]\nregion_name = "us-east-1"\n'
    )
