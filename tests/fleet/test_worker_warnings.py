"""A fleet run's warnings from its pool workers (``fleet run --workers N``) are printed as
the command prints its own: ``ptestore fleet: warning: ...``, one line, the names they
embed escaped. They were printed bare, so a name with a line break in it (a destination
directory here) started a line of its own, one that could pass for the command's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.fixtures import get_fixture

import ptestore

EXT = get_fixture("mlp_xnnpack_ext")
TREE = Path(ptestore.__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parents[1]
FORGED = "ptestore fleet: FORGED LINE"


def _fleet_run(job: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TREE), str(TESTS)]))
    return subprocess.run(
        [sys.executable, "-m", "ptestore", "fleet", "run", str(job), "--workers", "2"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_pool_workers_warning_is_the_commands_line(tmp_path: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    root = tmp_path / f"o\n{FORGED}"
    job = tmp_path / "job.toml"
    destination = f"{root}/{{device}}/{{model}}.pte".replace("\n", "\\n")
    job.write_text(
        f'destination = "{destination}"\n'
        'backends = ["support.fleet_backend:Scaler=1.0"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.d0]\nsoc = "x"\nscale = 2.0\n'
        '[devices.d1]\nsoc = "y"\nscale = 3.0\n'
    )
    first = _fleet_run(job, tmp_path)
    assert first.returncode == 0, first.stderr
    for shared in (root / "_shared" / "sha256-tree").iterdir():  # the shared .ptds damaged
        data = bytearray(shared.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shared.chmod(0o644)
        shared.write_bytes(bytes(data))
    (root / "d0" / "mlp.pte").unlink()  # its pair runs again, and checks the .ptd
    again = _fleet_run(job, tmp_path)
    assert again.returncode == 0, again.stderr
    lines = again.stderr.splitlines()
    warned = [ln for ln in lines if "damaged, stored again" in ln]
    assert warned, again.stderr
    assert all(ln.startswith(f"ptestore fleet: warning: {tmp_path}/o\\n{FORGED}/") for ln in warned)
    assert not [ln for ln in lines if ln.startswith(FORGED)], again.stderr
