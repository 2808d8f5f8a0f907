"""A backend's method that calls ``sys.exit()`` outside its run is that backend's failure,
named with the method, as the run names a ``sys.exit()`` in ``initialize_backend_data``
(``coordinator/calls.py``): never a silent exit.

Before, the callers outside the run caught ``Exception`` only: a ``check_compatibility``
that called ``sys.exit(0)`` ended ``ptestore verify --backend`` and ``ptestore select``
with status 0 and no output (``ptestore.verify`` and ``select`` raised ``SystemExit``),
and a ``compatibility_info`` that called ``sys.exit(3)`` was reported as
``initialize_backend_data failed: SystemExit: 3``. The backends are in
``tests/support/exiting_backend.py``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.exiting_backend import Exit

import ptestore
from ptestore.backends import DeviceProfile, register_backend, unregister_backend
from ptestore.backends.rating import rate
from ptestore.backends.versions import version_of
from ptestore.cli import main
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_FAILURE
from ptestore.errors import BackendError
from ptestore.fleet.select import select

SPEC = "support.exiting_backend:Exit"


@pytest.fixture
def made(src: Path, tmp_path: Path) -> Path:
    """An artifact ``Exit`` made (its run never asks ``check_compatibility``)."""
    out = tmp_path / "h.pte"
    argv = ["specialize", str(src), str(out), "--backend", SPEC, "--no-progress", "-q"]
    assert main(argv) == 0
    return out


def test_verify_names_a_check_that_exits(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["verify", str(made), "--backend", SPEC]) == EXIT_BAD_INPUT
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == (
        f"{made}: invalid: backend {SPEC!r}: check_compatibility failed: SystemExit: 0\n"
    )
    report = ptestore.verify(made, backends=[SPEC])  # no SystemExit out of the API either
    assert (report.status, report.exit_code) == ("invalid", EXIT_BAD_INPUT)
    assert report.error == f"backend {SPEC!r}: check_compatibility failed: SystemExit: 0"


def test_verify_json_says_it_too(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["verify", str(made), "--backend", SPEC, "--json"]) == EXIT_BAD_INPUT
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == f"backend {SPEC!r}: check_compatibility failed: SystemExit: 0"


def test_a_check_that_returns_no_rating_is_named() -> None:
    class NoRating(Exit):
        def check_compatibility(self, info: str, device: DeviceProfile | None) -> Any:
            return "optimal"

    with pytest.raises(BackendError) as err:
        rate(NoRating(), "", None, "acme")
    assert str(err.value) == (
        "backend 'acme': check_compatibility returned 'optimal', not a Compatibility"
    )


def test_compatibility_info_that_exits_is_named_as_such(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.pte"
    spec = "support.exiting_backend:InfoExit"
    argv = ["specialize", str(src), str(out), "--backend", spec, "--no-progress"]
    assert main(argv) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith(
        f"ptestore specialize: failed, nothing published: backend 'XnnpackBackend' ({spec}): "
        "compatibility_info failed: SystemExit: 3\n"
    ), err
    assert "initialize_backend_data" not in err
    assert not out.exists()


def test_a_version_that_exits_is_named(src: Path, tmp_path: Path) -> None:
    from support.exiting_backend import VersionExit

    with pytest.raises(BackendError) as err:
        version_of(VersionExit(), "acme")
    assert str(err.value) == "backend 'acme': reading its version failed: SystemExit: no SDK"
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[VersionExit()])
    assert str(err.value).endswith("reading its version failed: SystemExit: no SDK")


def test_keyboard_interrupt_still_goes_through() -> None:
    class Interrupted(Exit):
        def check_compatibility(self, info: str, device: DeviceProfile | None) -> Any:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rate(Interrupted(), "", None, "acme")


@pytest.fixture
def installed() -> Iterator[None]:
    register_backend(Exit, "exits")
    yield
    unregister_backend("exits")


def _index() -> dict[str, Any]:
    options = {"soc": "p"}
    entry = {
        "model": "m",
        "device": "p",
        "device_options": options,
        "device_digest": DeviceProfile("p", options).digest(),
        "source": {"url": "/src/m.pte", "size": 1, "sha256": "sha256:00"},
        "ptd_source": None,
        "pte": {"url": "/out/p/m.pte", "size": 1, "sha256": "sha256:11"},
        "ptd": None,
        "compatibility": [
            {"id": "XnnpackBackend", "spec": SPEC, "version": "1", "compatibility": ""}
        ],
    }
    return {"format": "ptestore.index", "version": 2, "entries": [entry]}


def test_select_rates_a_check_that_exits_unsupported_and_says_why(
    installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure to rate is no vouching (as for an exception): the portable source."""
    choice = select(_index(), "m", DeviceProfile("q", {"soc": "p"}))
    assert (choice.kind, choice.pte["url"]) == ("source", "/src/m.pte")
    assert (
        "XnnpackBackend: installed 'exits' cannot rate it: check_compatibility failed: "
        "SystemExit: 0" in choice.reason
    ), choice.reason
    index = tmp_path / "ptestore-index.json"
    index.write_text(json.dumps(_index()))
    capsys.readouterr()
    argv = ["select", str(index), "--model", "m", "--device", "q", "--device-option", "soc=p"]
    assert main([*argv, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["kind"] == "source"
    assert "check_compatibility failed: SystemExit: 0" in said["reason"]


class NameExits(Exit):
    """Its ``name`` property exits (an instance registered by a plugin)."""

    @property
    def name(self) -> str:  # type: ignore[override]
        sys.exit(0)


def test_the_listing_survives_a_name_that_exits(capsys: pytest.CaptureFixture[str]) -> None:
    """``installed_backends()`` (``ptestore backends``) lists it as generic, as it lists a
    name property that raises; a ``sys.exit()`` there ended the listing, status 0."""
    from ptestore.backends import installed_backends

    register_backend(NameExits(), "exits-by-name")
    try:
        (found,) = [b for b in installed_backends() if b.name == "exits-by-name"]
        assert found.serves == "*"
        capsys.readouterr()
        assert main(["backends"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if "exits-by-name" in x]
        assert line.split()[:2] == ["exits-by-name", "*"]
    finally:
        unregister_backend("exits-by-name")
