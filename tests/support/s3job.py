"""The ``[storage_options]`` tables of a fleet job file that reaches an S3 test server
(moto or SeaweedFS: a ``storage_options`` dict with ``endpoint_url``, ``key`` and
``secret``), and a model's portable source put on one (:func:`source_on_s3`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ptestore.testing.s3server import S3TestServer

__all__ = ["s3_options_toml", "source_on_s3"]


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


def source_on_s3(server: S3TestServer) -> tuple[str, tuple[str, str]]:
    """A new bucket of ``server`` holding the ``mlp_xnnpack_ext`` fixture's .pte and .ptd
    (``src/m.pte``, ``src/m.ptd``): the bucket and their URLs."""
    from support.fixtures import get_fixture

    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    bucket = server.new_bucket()
    client = server.client()
    client.put_object(Bucket=bucket, Key="src/m.pte", Body=ext.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="src/m.ptd", Body=ext.ptd_path.read_bytes())
    return bucket, (f"s3://{bucket}/src/m.pte", f"s3://{bucket}/src/m.ptd")
