"""Packed-weight files with the real runtime (executorch 1.4.1 through its Python bindings).

Every file here is made by the stock runtime in a child process and checked by
ptestore; each "fresh process" is a real new interpreter. Destructive tests work on a copy
of one made file (the identity is content-based, so a copy in another directory is the
same file for the same artifact).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.xnnpack_probe import REPO, env, flip, fresh_load, rewrite_weights

from ptestore.errors import IntegrityError, PackedWeightsRefused
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import CacheFile, find_cache, make_cache, verify_cache

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

FIXTURES = REPO / "tests" / "fixtures"
MLP = FIXTURES / "mlp_xnnpack.pte"
PY = sys.executable


def wait_for(condition: object, what: str, ceiling: float = 600.0) -> None:
    """Poll ``condition()`` until true; fail after a generous ceiling."""
    deadline = time.monotonic() + ceiling
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    return make_cache(MLP, directory=tmp_path_factory.mktemp("made"))


def copy_of(made: CacheFile, directory: Path) -> Path:
    for p in (made.path, made.record_path):
        shutil.copy2(p, directory / p.name)
    return directory / made.path.name


def test_made_verified_and_returned(made: CacheFile, tmp_path: Path) -> None:
    assert made.made and made.entries == 2  # fc1 and fc2, weight + bias each
    st = made.path.stat()
    assert st.st_mode & 0o777 == 0o444 and st.st_size == made.size
    record = json.loads(made.record_path.read_text())
    assert record["sha256"] == made.sha256 and record["size"] == made.size
    assert record["identity"]["pte_sha256"] == made.identity.pte_sha256
    assert record["identity"]["executorch_version"] == "1.4.1+cpu"
    assert record["identity"]["cpu"] == made.identity.cpu
    again = make_cache(MLP, directory=made.path.parent)
    assert not again.made and again.path == made.path and again.sha256 == made.sha256
    found = find_cache(MLP, directory=made.path.parent)
    assert found is not None and found.sha256 == made.sha256
    assert verify_cache(made.path, pte=MLP).entries == 2
    assert verify_cache(made.path, pte=MLP, full=False).sha256 == made.sha256
    assert record["stamp"]["ino"] == st.st_ino and record["stamp"]["ctime_ns"] == st.st_ctime_ns
    assert made.record_path.stat().st_mode & 0o777 == 0o444  # published read-only as well
    # nothing else is left in the directory: no temporaries, no refusal
    names = sorted(p.name for p in made.path.parent.iterdir())
    assert names == sorted([made.path.name, made.record_path.name, made.path.name + ".lock"])


def test_a_fresh_process_loads_with_it_bit_identically(made: CacheFile) -> None:
    result, stderr = fresh_load(MLP, made.path)
    assert result == {
        "same_bytes": True,
        "dtype": "float32",
        "shape": [2, 8],
        "loads_with_options": 1,
    }
    # the runtime really loaded the file (its own log line), and left it as it was
    assert "Loaded packed weight cache: /proc/self/fd/" in stderr  # the inode load() checked
    assert "(2 entries)" in stderr
    assert verify_cache(made.path, pte=MLP).sha256 == made.sha256


def test_a_rewritten_artifact_gets_a_new_file_never_the_old_one(
    made: CacheFile, tmp_path: Path
) -> None:
    rewritten = tmp_path / "rewritten.pte"
    rewrite_weights(MLP, rewritten)
    directory = tmp_path / "cache"
    directory.mkdir()
    old = copy_of(made, directory)
    assert find_cache(rewritten, directory=directory) is None
    with pytest.raises(IntegrityError) as err:
        verify_cache(old, pte=rewritten)
    assert f"{old}: made for another artifact, runtime or CPU (pte_sha256: " in str(err.value)
    new = make_cache(rewritten, directory=directory)
    assert new.made and new.path != old and new.sha256 != made.sha256
    assert old.is_file()  # the old artifact's file is untouched, still its own
    assert verify_cache(old, pte=MLP).sha256 == made.sha256


def test_a_flipped_byte_is_caught_before_the_runtime_and_the_file_is_rebuilt(
    made: CacheFile, tmp_path: Path
) -> None:
    path = copy_of(made, tmp_path)
    flip(path)
    with pytest.raises(IntegrityError) as err:
        verify_cache(path, pte=MLP)
    assert str(err.value).startswith(f"{path}: SHA-256 ")
    assert str(err.value).endswith(f" != recorded {made.sha256}")
    from ptestore.xnnpack import load

    with pytest.raises(IntegrityError):  # load() verifies before the runtime sees it
        load(MLP, cache=path)
    assert find_cache(MLP, directory=tmp_path) is None
    rebuilt = make_cache(MLP, directory=tmp_path)
    assert rebuilt.made and rebuilt.path == path and rebuilt.sha256 == made.sha256
    # the quick check (no SHA-256 for the inode published with the record) still sees a
    # byte written in place: the write changes the file's mtime and ctime
    assert verify_cache(path, pte=MLP, full=False).sha256 == made.sha256
    flip(path)
    with pytest.raises(IntegrityError) as err:
        verify_cache(path, pte=MLP, full=False)
    assert str(err.value).endswith(f" != recorded {made.sha256}")


def test_a_truncated_file_is_caught(made: CacheFile, tmp_path: Path) -> None:
    path = copy_of(made, tmp_path)
    os.chmod(path, 0o644)
    os.truncate(path, made.size - 20)
    os.chmod(path, 0o444)
    with pytest.raises(IntegrityError) as err:
        verify_cache(path, pte=MLP)
    assert str(err.value) == f"{path}: size {made.size - 20} != recorded {made.size}"
    assert find_cache(MLP, directory=tmp_path) is None


def test_a_writable_or_unrecorded_file_is_not_handed_out(made: CacheFile, tmp_path: Path) -> None:
    path = copy_of(made, tmp_path)
    os.chmod(path, 0o644)
    with pytest.raises(IntegrityError) as err:
        verify_cache(path, pte=MLP)
    assert str(err.value) == f"{path}: mode 0o644 is writable; published files are 0444"
    os.chmod(path, 0o444)
    record = path.with_name(path.name + ".json")
    record.unlink()
    with pytest.raises(IntegrityError) as err:
        verify_cache(path, pte=MLP)
    assert str(err.value) == f"{path}: no record beside it ({record.name})"


MAKER = textwrap.dedent(
    """
    import json, sys
    from ptestore.xnnpack import make_cache
    made = make_cache(sys.argv[1], directory=sys.argv[2])
    print(json.dumps({"made": made.made, "sha256": made.sha256, "path": str(made.path)}))
    """
)


@pytest.mark.slow
def test_a_killed_maker_leaves_nothing_that_could_be_handed_out(
    made: CacheFile, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [PY, "-c", MAKER, str(MLP), str(tmp_path)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # kill it (and its runtime child) once the runtime has written a packed file
    wait_for(
        lambda: any(tmp_path.glob(".xnnpack-*/packed.xpwc")) or proc.poll() is not None,
        "the runtime child to write its temporary file",
    )
    assert proc.poll() is None, "the maker finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not list(tmp_path.glob("*.xpwc")) and not list(tmp_path.glob("*.xpwc.json"))
    assert find_cache(MLP, directory=tmp_path) is None
    again = make_cache(MLP, directory=tmp_path)
    assert again.made and again.sha256 == made.sha256
    # the next maker removed what the killed one left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_make_removes_what_killed_makers_of_other_artifacts_left(
    made: CacheFile, tmp_path: Path
) -> None:
    import fcntl

    gone, live = "xnnpack-" + "a" * 32, "xnnpack-" + "b" * 32
    for name in (gone, live):
        (tmp_path / f".{name}.k1").mkdir()
        (tmp_path / f".{name}.k1" / "packed.xpwc").write_bytes(b"x" * 4096)
        (tmp_path / f"{name}.xpwc.lock").touch()
    fd = os.open(tmp_path / f"{live}.xpwc.lock", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # its maker still works
        again = make_cache(MLP, directory=tmp_path)
    finally:
        os.close(fd)
    assert again.made and again.sha256 == made.sha256
    # the killed maker's work directory (its lock free) is gone, the live one's kept
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [f".{live}.k1"]


@pytest.mark.slow
def test_two_makers_at_once_end_correct(made: CacheFile, tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [PY, "-c", MAKER, str(MLP), str(tmp_path)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["made"] for r in results) == [False, True]  # one made it, one found it
    assert {r["sha256"] for r in results} == {made.sha256}
    assert verify_cache(results[0]["path"], pte=MLP).sha256 == made.sha256


def test_an_artifact_with_a_ptd_is_bound_to_both(tmp_path: Path) -> None:
    pte, ptd = FIXTURES / "mlp_xnnpack_ext.pte", FIXTURES / "mlp_xnnpack_ext.ptd"
    made = make_cache(pte, ptd=ptd, directory=tmp_path)
    assert made.entries == 2 and made.identity.ptd_sha256 is not None
    assert verify_cache(made.path, pte=pte, ptd=ptd).sha256 == made.sha256
    with pytest.raises(IntegrityError) as err:  # the same .pte without its .ptd
        verify_cache(made.path, pte=pte)
    assert "ptd_sha256: " in str(err.value)


@pytest.mark.slow
def test_the_models_script_writes_the_ptd_it_promises(tmp_path: Path) -> None:
    """``make_xnnpack_models.py linear OUT.pte --ptd`` (an ``nn.Sequential``, whose
    top-level weights lost their external tag on export) writes the .pte without its
    weights and the .ptd with every one, and the pair makes a file."""
    from ptestore.format.reader import read_container
    from ptestore.storage.loaders import LocalFileLoader
    from ptestore.xnnpack import artifact_keys

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import export_linear_stack
    finally:
        sys.path.remove(str(REPO / "scripts"))
    pte, ptd = export_linear_stack(tmp_path / "lin.pte", layers=2, dim=16, ptd=True)
    assert ptd == tmp_path / "lin.ptd"

    def named(path: Path) -> set[str]:
        loader = LocalFileLoader(str(path))
        try:
            return {n.key for n in read_container(loader).container.named_data or []}
        finally:
            loader.close()

    assert named(pte) == set()  # no weight left in the .pte
    assert named(ptd) == artifact_keys(pte) and len(named(ptd)) == 4  # 2 x (weight, bias)
    made = make_cache(pte, ptd=ptd, directory=tmp_path / "cache")
    assert made.made and made.entries == 2


@pytest.mark.slow
def test_the_models_script_refuses_a_ptd_it_cannot_write_before_writing(tmp_path: Path) -> None:
    """What ``--ptd`` would get wrong is refused before any file is written: weights
    whose tag the export dropped (a bare ``nn.Sequential``, as the script exported it
    before), a program with no weight to put in a .ptd."""
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import _external, _lower
    finally:
        sys.path.remove(str(REPO / "scripts"))
    x = (torch.randn(1, 16),)
    out = tmp_path / "m.pte"
    with pytest.raises(RuntimeError) as err:
        _external(nn.Sequential(nn.Linear(16, 16)).eval(), x, out)
    assert str(err.value) == (
        f"{out}: not written: the weights ['p_0_weight', 'p_0_bias'] lost their external "
        "tag on export and would stay in the .pte (--ptd puts every weight in the .ptd)"
    )
    with pytest.raises(RuntimeError) as err:
        _lower(nn.ReLU(), x, out, True)
    assert str(err.value) == (
        f"{out}: not written: the export made 0 .ptd files []; --ptd writes exactly one"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_conv_prelu_crash_is_refused_cleanly(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_xnnpack_models import export_conv_prelu
    finally:
        sys.path.remove(str(REPO / "scripts"))
    (pte,) = export_conv_prelu(tmp_path / "prelu.pte")
    directory = tmp_path / "cache"
    with pytest.raises(PackedWeightsRefused) as err:
        make_cache(pte, directory=directory)
    message = str(err.value)
    assert message.startswith(
        f"{pte}: no XNNPACK packed-weight file: the ExecuTorch runtime crashed "
        "(SIGSEGV, exit 139) while making the packed-weight file"
    )
    assert message.endswith("(the artifact still loads without one)")
    assert err.value.artifact == str(pte)
    assert not list(directory.glob("*.xpwc")) and find_cache(pte, directory=directory) is None
    # the refusal is remembered: no second crash loop
    started = time.monotonic()
    with pytest.raises(PackedWeightsRefused) as again:
        make_cache(pte, directory=directory)
    assert "(refused before)" in str(again.value) and time.monotonic() - started < 60
    # and the artifact still runs without a cache
    import numpy as np

    from ptestore.testing.runtime import run_in_runtime

    out = run_in_runtime(pte, inputs={"forward": [np.zeros((1, 3, 16, 16), np.float32)]})
    assert out["forward"][0].shape == (1, 8, 12, 12)


def test_a_program_without_xnnpack_weights_is_refused_without_running(tmp_path: Path) -> None:
    pte = FIXTURES / "mlp_portable.pte"
    with pytest.raises(PackedWeightsRefused) as err:
        make_cache(pte, directory=tmp_path)
    assert str(err.value) == (
        f"{pte}: no XNNPACK packed-weight file: it has no XNNPACK delegate with named "
        "weights (nothing to pack) (the artifact still loads without one)"
    )
    assert not list(tmp_path.glob("*.xpwc"))
    # the refusal is remembered, read-only, and nothing temporary is left beside it
    (refused,) = tmp_path.glob("*.refused.json")
    assert refused.stat().st_mode & 0o777 == 0o444
    assert json.loads(refused.read_text())["reason"] == (
        "it has no XNNPACK delegate with named weights (nothing to pack)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [refused.name, refused.name.replace(".refused.json", ".xpwc.lock")]
    ) and not list(tmp_path.glob("*.xpwc.json"))
