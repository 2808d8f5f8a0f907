"""``adopt_cache``: a delivery killed while it waits for the maker's lock leaves its
download writable (the next fetch resumes it), and the next call installs it."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.locks import blocked_on, wait_until
from support.xnnpack_probe import REPO, env

from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import CacheFile, adopt_cache, find_cache, make_cache
from ptestore.xnnpack.record import paths

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

MLP = REPO / "tests" / "fixtures" / "mlp_xnnpack.pte"

ADOPT = textwrap.dedent(
    """
    import json, sys
    from ptestore.xnnpack import adopt_cache
    part, pte, directory, made_for, size, sha256 = sys.argv[1:]
    adopt_cache(part, pte=pte, directory=directory, made_for=json.loads(made_for),
                size=int(size), sha256=sha256, hashed=True)
    """
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    return make_cache(MLP, directory=tmp_path_factory.mktemp("made"))


def test_a_delivery_killed_waiting_for_the_lock_leaves_its_part_writable(
    made: CacheFile, tmp_path: Path
) -> None:
    part = tmp_path / "xnnpack-download-0123456789abcdef.xpwc.part"
    shutil.copyfile(made.path, part)
    os.chmod(part, 0o644)
    lock_path = paths(tmp_path, made.identity)[2]
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # someone holds the maker's lock for a while
        argv = [str(part), str(MLP), str(tmp_path), json.dumps(made.identity.to_json())]
        child = subprocess.Popen(
            [sys.executable, "-c", ADOPT, *argv, str(made.size), made.sha256], env=env()
        )
        try:
            wait_until(lambda: blocked_on(lock_path), "the delivery to wait for the lock")
        finally:
            child.send_signal(signal.SIGKILL)  # the OOM killer, a power cut
            child.wait()
    finally:
        os.close(fd)
    assert part.stat().st_mode & 0o777 == 0o644  # not made read-only before the lock
    assert find_cache(MLP, directory=tmp_path) is None
    adopted = adopt_cache(
        part,
        pte=MLP,
        directory=tmp_path,
        made_for=made.identity.to_json(),
        size=made.size,
        sha256=made.sha256,
        hashed=True,
    )
    assert adopted.path.stat().st_mode & 0o777 == 0o444 and not part.exists()
    assert find_cache(MLP, directory=tmp_path) is not None
