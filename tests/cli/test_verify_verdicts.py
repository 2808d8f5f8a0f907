"""``ptestore verify``: what a verdict may say. ``URL --job JOB`` of a URL no pair of the
job writes is refused (it compared nothing and said "current"); ``--range`` of a damaged
chunk is the ``invalid`` verdict, as the full check's (it was the ``{"error": ...}``
object)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from support.digests import tree
from support.fixtures import get_fixture

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main

MLP = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"
DEVICE = DeviceProfile("pixel9", {"soc": "sm8650", "scale": 2.0})


def _job(tmp: Path, scale: float = 2.0) -> Path:
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        f'[devices.pixel9]\nsoc = "sm8650"\nscale = {scale}\n'
    )
    return job


@pytest.fixture
def made(tmp_path: Path) -> Path:
    """The job's pixel9 artifact, made where the job puts it."""
    assert MLP.pte_path is not None
    out = tmp_path / "out" / "pixel9" / "mlp.pte"
    out.parent.mkdir(parents=True)
    ptestore.specialize(MLP.pte_path, out, backends=[SPEC], device=DEVICE, provenance=True)
    return out


def _refusal(url: str, job: Path, listed: str) -> str:
    return (
        f"{url}: not a destination of the job {job} ({listed}): --job compares a "
        "destination with its pair's source, device and backends, and this URL is none "
        "(a copy under another name, a mistyped path); give a destination of the job, "
        "or --device NAME to compare it with that device of the job and its backends "
        "(--source SRC for what it was made from)"
    )


def test_a_url_no_pair_of_the_job_writes_is_refused(
    made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of a job's output under another name, or a mistyped destination, said
    "current" (exit 0, no finding) with ``--job``: nothing of a pair had been compared
    with it. It is a usage error, exit 2, naming the job's nearest destinations."""
    job = _job(tmp_path)
    copy = tmp_path / "elsewhere.pte"
    shutil.copyfile(made, copy)
    typo = f"{tmp_path}/out/pixel9/mlp.pt"
    for url in (str(copy), typo):
        message = _refusal(url, job, f"nearest: {made}")
        assert main(["verify", url, "--job", str(job), "--json"]) == 2, url
        out, err = capsys.readouterr()
        error = json.loads(out)["error"]
        assert (error["type"], error["message"], error["exit_code"]) == (
            "ConfigurationError",
            message,
            2,
        )
        assert err == f"ptestore verify: error: {message}\n"
        assert main(["verify", url, "--job", str(job)]) == 2
        assert capsys.readouterr() == ("", f"ptestore verify: error: {message}\n")
    # nothing near: the first destinations, and how many more
    wide = tmp_path / "wide.toml"
    wide.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "mlp"\nsource = "{MLP.pte_path}"\n'
        + "".join(f"[devices.d{i}]\n" for i in range(5))
    )
    far = "memory://q/z.pte"
    first = ", ".join(f"{tmp_path}/out/d{i}/mlp.pte" for i in range(3))
    assert main(["verify", far, "--job", str(wide)]) == 2
    said = _refusal(far, wide, f"its destinations: {first} and 2 more")
    assert capsys.readouterr().err == f"ptestore verify: error: {said}\n"


def test_what_a_url_that_is_no_destination_may_still_be_checked_with(
    made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The destination itself, in any spelling, as before; ``--device NAME`` with a copy:
    compared with that device of the job (its options) and the job's backends; a
    fleet's shared content-addressed ``.ptd``: at most intact, as without ``--job``."""
    job = _job(tmp_path)
    copy = tmp_path / "elsewhere.pte"
    shutil.copyfile(made, copy)
    assert main(["verify", str(made), "--job", str(job)]) == 0
    assert capsys.readouterr().out == f"{made}: current\n"
    assert main(["verify", str(copy), "--job", str(job), "--device", "pixel9"]) == 0
    assert capsys.readouterr().out == f"{copy}: current\n"
    _job(tmp_path, scale=3.0)  # the job's pixel9 is another profile now
    assert main(["verify", str(copy), "--job", str(job), "--device", "pixel9"]) == 1
    assert capsys.readouterr().err.startswith(f"{copy}: stale: device.digest: ")
    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.ptd_path is not None
    data = ext.ptd_path.read_bytes()
    hex_ = tree(data).partition(":")[2]
    shared = tmp_path / "out" / "_shared" / "sha256-tree" / f"{hex_}.ptd"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(data)
    assert main(["verify", str(shared), "--job", str(job)]) == 0
    assert capsys.readouterr().out.startswith(f"{shared}: intact; a shared content-addressed")


def test_a_damaged_chunk_in_a_range_is_an_invalid_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--range`` of an artifact with a byte flipped inside the range: the ``invalid``
    report (``"status": "invalid"``, ``URL: invalid: ...`` naming the damaged chunk and
    its bytes), exit 2, as the full check says damage; it was the ``{"error": ...}``
    object and ``ptestore verify: error: ...``. A bad range stays an error."""
    assert MLP.pte_path is not None
    good = tmp_path / "good.pte"
    ptestore.specialize(MLP.pte_path, good, backends=[SPEC], device=DEVICE, provenance=True)
    report = ptestore.verify(good)
    assert report.provenance is not None and report.provenance.content is not None
    size = report.provenance.content.size
    data = bytearray(good.read_bytes())
    data[size // 2] ^= 0xFF  # a byte of the content, not of the structure --quick reads
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))
    assert main(["verify", str(bad), "--quick"]) == 0  # the premise: structure intact
    capsys.readouterr()
    got = hashlib.sha256(data[:size]).hexdigest()
    want = hashlib.sha256(good.read_bytes()[:size]).hexdigest()
    error = (
        f"{bad}: content.chunks[0] = '{got}': must be {want}, the SHA-256 the record "
        f"names for bytes 0:{size} (a byte in 0:{size} was damaged or changed after the "
        "record was made)"
    )
    span = f"{size // 2}:{size // 2 + 1}"
    assert main(["verify", str(bad), "--range", span, "--json"]) == 2
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert (shown["status"], shown["exit_code"], shown["error"]) == ("invalid", 2, error)
    assert err == f"{bad}: invalid: {error}\n"
    assert main(["verify", str(bad), "--range", span]) == 2
    assert capsys.readouterr() == ("", f"{bad}: invalid: {error}\n")
    assert main(["verify", str(bad), "--range", "7:7", "--json"]) == 2
    out, err = capsys.readouterr()
    refused = f"{bad}: byte range 7:7 is empty (END is exclusive): nothing to check; give "
    assert json.loads(out)["error"]["message"].startswith(refused)
    assert err.startswith(f"ptestore verify: error: {refused}")
