"""A backend whose ``version`` property raises is named wherever ptestore reads a version:
a run's provenance (``tests/coordinator/test_backend_naming.py``), the device cache's key
(``ensure``), a fleet plan, a fleet worker's check and ``verify --backend``. Before, all
but the first let the backend's own exception escape (a raw ``RuntimeError``; the CLI
called it an internal error), and a default ``ensure`` without backends failed for every
model because of one installed backend.

A version or a SPEC that provenance cannot record is refused where it is read, naming
the backend and the field, as ``compatibility_info`` is: text that is not valid UTF-8 (a
lone surrogate: an SDK string or ``argv`` bytes decoded with ``surrogateescape``)
escaped as a raw ``UnicodeEncodeError`` from the trailer's encoder (a CLI traceback,
exit 1), and a version of megabytes as "provenance payload is N bytes" naming neither
the backend nor the field (exit 2). A version is at most ``MAX_VERSION`` bytes, a SPEC
``MAX_SPEC``; ``encode_trailer`` itself names the field of a string nobody checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.backends.versions import MAX_SPEC, MAX_VERSION, version_of
from ptestore.cli import main
from ptestore.cli.exits import EXIT_BAD_INPUT
from ptestore.errors import BackendError, ConfigurationError
from ptestore.provenance.trailer import encode_trailer

SPEC = "support.broken_version:BrokenVersion"
MESSAGE = f"backend {SPEC!r}: reading its version failed: RuntimeError: cannot read VERSION"


def test_ensure_names_the_backend(src: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.ensure(src, cache_dir=tmp_path / "cache", backends=[SPEC])
    assert str(err.value) == MESSAGE
    assert not (tmp_path / "cache" / "entries").exists() or not any(
        (tmp_path / "cache" / "entries").iterdir()
    )


def test_a_fleet_plan_names_the_backend() -> None:
    from ptestore.fleet.plan import backend_versions

    with pytest.raises(BackendError) as err:
        backend_versions((f" {SPEC} ",))
    assert str(err.value) == MESSAGE


def test_verify_names_the_backend(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pte"
    ptestore.specialize(src, out, backends=["support.doubling_backend:Doubling=mlp_xnnpack"])
    with pytest.raises(BackendError) as err:
        ptestore.verify(out, backends=[SPEC])
    assert str(err.value) == MESSAGE


class Reverses(BackendInterface):
    """Replaces the first named value by itself reversed; ``version`` set per test."""

    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))


class SdkVersion(Reverses):
    version = "7.3-" + b"r\xe9v".decode("utf-8", "surrogateescape")  # type: ignore[assignment]


class HugeVersion(Reverses):
    version = "1.0+" + "g" * (2 << 20)  # type: ignore[assignment]  # a changelog in it


LIMIT = "a version names a build and is recorded in every artifact; put build details in "
LIMIT += "compatibility_info"


@pytest.mark.parametrize("in_place", [False, True], ids=["new-file", "in-place"])
def test_a_version_that_is_not_utf8_names_the_backend_and_the_field(
    src: Path, tmp_path: Path, in_place: bool
) -> None:
    dst = src if in_place else tmp_path / "out.pte"
    before = src.read_bytes()
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, dst, backends=[SdkVersion()], in_place=in_place)
    label = f"{SdkVersion.__module__}:{SdkVersion.__qualname__}"
    assert str(err.value) == (
        f"backend 'XnnpackBackend' ({label}): its version is text that is not valid UTF-8 "
        "(character '\\udce9' at index 5); provenance records it as JSON"
    )
    assert err.value.backend == "XnnpackBackend"
    assert src.read_bytes() == before and (in_place or not dst.exists())


def test_a_huge_version_names_the_backend_the_field_its_size_and_the_limit(
    src: Path, tmp_path: Path
) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, tmp_path / "out.pte", backends=[HugeVersion()])
    label = f"{HugeVersion.__module__}:{HugeVersion.__qualname__}"
    assert str(err.value) == (
        f"backend 'XnnpackBackend' ({label}): its version is {4 + (2 << 20)} bytes; the "
        f"limit is {MAX_VERSION} ({LIMIT})"
    )
    assert not (tmp_path / "out.pte").exists()
    # Wherever a version is read (a fleet plan, verify, the device cache's key).
    with pytest.raises(BackendError, match=r"its version is 2097156 bytes; the limit is 1024"):
        version_of(HugeVersion(), "x")
    over, fits = Reverses(), Reverses()
    over.version, fits.version = "v" * (MAX_VERSION + 1), "v" * MAX_VERSION
    assert version_of(fits, "x") == fits.version
    with pytest.raises(BackendError, match=r"is 1025 bytes; the limit is 1024 "):
        version_of(over, "x")


@pytest.mark.parametrize("in_place", [False, True], ids=["new-file", "in-place"])
def test_a_spec_that_is_not_utf8_is_bad_input(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], in_place: bool
) -> None:
    """argv bytes that are not UTF-8 reach Python as lone surrogates."""
    spec = "command@XnnpackBackend=sh -c cat \udcff"
    before = src.read_bytes()
    dst = src if in_place else tmp_path / "o.pte"
    where = ["--in-place"] if in_place else []
    argv = ["specialize", str(src), str(dst), *where, "--backend", spec, "--no-progress"]
    assert main(argv) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        f"ptestore specialize: error: backend {spec!r}: its SPEC is text that is not valid "
        "UTF-8 (character '\\udcff' at index 33); provenance records it as JSON\n"
    )
    assert src.read_bytes() == before and (in_place or not dst.exists())


def test_a_huge_spec_is_bad_input(src: Path, tmp_path: Path) -> None:
    spec = "command@XnnpackBackend=true " + "x" * MAX_SPEC
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[spec])
    assert str(err.value) == (
        f"backend {spec[:77] + '...'!r}: its SPEC is {len(spec)} bytes; the limit is "
        f"{MAX_SPEC} (provenance records it)"
    )


def test_the_trailer_names_a_field_that_is_not_utf8() -> None:
    """The backstop: a string no maker checked is a ptestore error naming its field."""
    record = {"backends": [{"id": "X", "version": "1"}], "requested": [{"spec": "a\udcffb"}]}
    with pytest.raises(ConfigurationError) as err:
        encode_trailer(record, 10)
    assert str(err.value) == (
        "provenance field requested[0].spec (character '\\udcff' at index 1) is not valid "
        "UTF-8 text (a lone surrogate: bytes that were not UTF-8, decoded with "
        "surrogateescape); provenance records JSON"
    )
