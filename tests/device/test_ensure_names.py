"""``ensure`` and the cache with names that are not UTF-8 (Linux allows any byte but NUL
and ``/``: Python gives such bytes as surrogate escapes) and with cache directories the
file system refuses: keyed by the name's bytes (a UTF-8 name's key as it always was),
recorded and shown as the other commands show such names; a cache directory that cannot
be made classified as the writers classify their destinations (bad input, exit 2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.as_user import NOBODY, as_user
from support.fixtures import get_fixture
from support.fleetrun import fleet_run

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.device import list_entries
from ptestore.device.indexed import index_key
from ptestore.device.keys import entry_key
from ptestore.errors import ConfigurationError, ObjectNotFound, PermissionDenied

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.counting_backend:Counting=1.0"
#: A byte that is not UTF-8, as Python decodes it in a file name (``os.fsdecode``).
FF = os.fsdecode(b"\xff")


def _src(directory: Path, name: str) -> str:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    directory.mkdir(parents=True, exist_ok=True)
    path = os.path.join(directory, name)
    shutil.copyfile(fx.pte_path, path)
    return path


def test_the_keys_of_utf8_names_are_what_they_were() -> None:
    """Computed by the code before names that are not UTF-8 were keyed by their bytes:
    existing caches keep their entries."""
    pte, ptd = "/nonexistent/dir/modèle-日本.pte", "/nonexistent/dir/w€.ptd"
    device = DeviceProfile("pixel9", {})
    assert entry_key(pte, ptd, ["passthrough"], device, False) == "b18e505e228cb17ac4f9b22d824e6f9d"
    assert entry_key(pte, None, None, None, True, False) == "aa9ffc08be819510b37874ae09c86264"
    assert index_key("/nonexistent/dir/índex.json", "mlp", "pixel9") == (
        "eedb929931e05ef337fdc1c7ddd2739b"
    )


def test_names_that_are_not_utf8_are_keyed_by_their_bytes() -> None:
    a, b = f"/nonexistent/a{FF}b.pte", "/nonexistent/a\udcfeb.pte"
    keys = {entry_key(p, None, None, None, False) for p in (a, b, "/nonexistent/a\\xffb.pte")}
    assert len(keys) == 3  # other bytes, other keys; never the escaped spelling's
    assert entry_key(a, None, None, None, False) == entry_key(a, None, None, None, False)
    assert index_key(f"/x{FF}/ptestore-index.json", "m", "d") != index_key(
        "/x\\xff/ptestore-index.json", "m", "d"
    )
    # a lone surrogate no file name decodes to (a URL given to the API): a key all the same
    assert len(entry_key("s3://b/\ud800.pte", None, None, None, False)) == 32


@pytest.mark.parametrize("in_place", [False, True])
def test_ensure_of_a_source_whose_name_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_place: bool
) -> None:
    """Was a UnicodeEncodeError traceback, exit 1 (copy and in place)."""
    src, cache = _src(tmp_path / "nu", f"a{FF}b.pte"), tmp_path / "cache"
    argv = ["ensure", src, "--cache-dir", str(cache), "--backend", SPEC]
    argv += ["--in-place"] if in_place else []
    assert main(argv) == 0
    shown = capsys.readouterr().out.splitlines()
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["created"] is False  # a hit: the same key
    want = src if in_place else out["pte"]
    assert out["pte"] == want and shown == [want.replace(FF, "\\udcff")]  # as inspect shows
    manifest = json.loads((Path(cache) / "entries" / out["key"] / "manifest.json").read_text())
    assert manifest["source"] == src  # recorded as the name it is (JSON: "\udcff")
    assert main(["cache", "ls", "--cache-dir", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"][0]["source"] == src
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith("a\\udcffb.pte" + in_place * " (in place)")
    assert main(["cache", "prune", "--stale", "--cache-dir", str(cache)]) == 0
    assert list_entries(cache)[0].state == "ready"  # the source is there: kept


def test_ensure_with_a_ptd_whose_name_is_not_utf8(tmp_path: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    ptd = os.path.join(tmp_path, f"w{FF}.ptd")
    shutil.copyfile(EXT.ptd_path, ptd)
    first = ptestore.ensure(str(EXT.pte_path), cache_dir=tmp_path / "c", ptd=ptd, backends=[SPEC])
    again = ptestore.ensure(str(EXT.pte_path), cache_dir=tmp_path / "c", ptd=ptd, backends=[SPEC])
    assert first.created and not again.created and first.key == again.key
    assert first.ptd is not None and Path(first.ptd).read_bytes()[:8] == Path(ptd).read_bytes()[:8]


def test_ensure_from_an_index_whose_path_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        'backends = ["support.fleet_backend:Scaler=1.0"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n'
    )
    index = fleet_run(job, capsys)
    odd = tmp_path / f"x{FF}"
    shutil.copytree(Path(index).parent, odd)  # the index and its shards
    argv = ["ensure", str(odd / "ptestore-index.json"), "--cache-dir", str(tmp_path / "c")]
    argv += ["--model", "m", "--device", "a", "--device-option", "soc=x"]
    argv += ["--device-option", "scale=2.0", "--json"]
    assert main(argv) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["created"] is True and made["choice"]["kind"] == "artifact"
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["created"] is False


def test_a_cache_directory_whose_name_is_not_utf8_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, cache = _src(tmp_path, "m.pte"), os.path.join(tmp_path, f"x{FF}", "cache")
    assert main(["ensure", src, "--cache-dir", cache, "--backend", SPEC]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(os.path.join(str(tmp_path), "x\\udcff", "cache", "entries"))
    assert main(["cache", "ls", "--cache-dir", cache]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and listed[0].split()[1] == "ready"


def _ensure_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cache: str
) -> tuple[int, str]:
    src = _src(tmp_path, "m.pte")
    code = main(["ensure", src, "--cache-dir", cache, "--backend", SPEC])
    return code, capsys.readouterr().err.splitlines()[0]


def test_a_cache_directory_name_over_name_max_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was exit 1, 'File name too long' without the limit."""
    cache = os.path.join(tmp_path, "a" * 300)
    code, err = _ensure_error(tmp_path, capsys, cache)
    assert code == 2
    assert err == (
        f"ptestore ensure: error: {cache}: cannot create the cache directory: File name too "
        f"long (the name {'a' * 40!r}... (300 characters) is 300 bytes long, over the file "
        "system's limit of 255 bytes per name (NAME_MAX))"
    )


def test_a_cache_directory_under_a_file_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was exit 1; ``specialize M file.pte/o.pte`` exits 2."""
    (tmp_path / "file.pte").write_bytes(b"x")
    cache = str(tmp_path / "file.pte" / "c")
    code, err = _ensure_error(tmp_path, capsys, cache)
    assert (code, err) == (
        2,
        f"ptestore ensure: error: {cache}: cannot create the cache directory: Not a directory",
    )
    with pytest.raises(ObjectNotFound):
        ptestore.ensure(_src(tmp_path, "n.pte"), cache_dir=cache, backends=[SPEC])


@pytest.mark.parametrize("cache", ["/proc", "/proc/x/y"])
def test_a_cache_directory_on_a_file_system_that_takes_none_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cache: str
) -> None:
    """Was exit 1, 'No such file or directory', as if something were missing."""
    made = "/proc/entries" if cache == "/proc" else "/proc/x/y"
    code, err = _ensure_error(tmp_path, capsys, cache)
    assert (code, err) == (
        2,
        f"ptestore ensure: error: {made}: cannot create the cache directory: No such file or "
        "directory (the directory /proc exists; its file system takes no new directory there)",
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="runs nobody's part as root")
def test_a_cache_directory_this_user_cannot_create_is_permission_denied(tmp_path: Path) -> None:
    src = _src(tmp_path, "m.pte")
    os.chmod(tmp_path, 0o755)
    os.chmod(src, 0o644)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)  # root's: nobody cannot make anything in it
    cache = str(locked / "cache")

    def work() -> object:
        try:
            ptestore.ensure(src, cache_dir=cache, backends=["passthrough"])
        except (PermissionDenied, ConfigurationError) as exc:
            return f"{type(exc).__name__} {exc}"
        return "made"

    assert as_user(NOBODY, work) == (
        f"ok: PermissionDenied {cache}: cannot create the cache directory: Permission denied"
    )
