"""Issue 19: what backend authors hit (declining, the unchanged-copy rule, registry
versions, return values, wildcards, BackendData checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NotSupported,
)
from ptestore.cli import main
from ptestore.errors import BackendError, ConfigurationError, NothingSpecialized

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
LABEL = "test_backend_issue19:Quiet"


class Quiet(BackendInterface):
    """Visits every input and writes nothing."""

    name = "XnnpackBackend"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for _ in context:
            pass


@pytest.fixture
def src(tmp_path: Path) -> Path:
    assert MLP.pte_path is not None
    p = tmp_path / "model.pte"
    p.write_bytes(MLP.pte_path.read_bytes())
    return p


# -- a backend that writes nothing declines, with the backend's own reason ----------
def test_writing_nothing_is_declining(src: Path, tmp_path: Path) -> None:
    report = ptestore.specialize(src, tmp_path / "o.pte", backends=[Quiet()], allow_unchanged=True)
    (b,) = report.backends
    assert (b.status, b.inputs_seen) == ("not_supported", 1)
    assert b.reason == (
        "returned without writing anything (1 delegate inputs seen); "
        "raise NotSupported('why') to say why"
    )
    assert not report.specialized
    assert report.unchanged_reason == (
        f"every backend declined ('XnnpackBackend': {LABEL} declined: {b.reason})"
    )


def test_the_not_supported_message_is_kept(src: Path, tmp_path: Path) -> None:
    class Declines(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            raise NotSupported("needs an NPU with int4 support")

    report = ptestore.specialize(
        src, tmp_path / "o.pte", backends=[Declines()], allow_unchanged=True
    )
    assert report.backends[0].reason == "needs an NPU with int4 support"
    assert "declined: needs an NPU with int4 support" in (report.unchanged_reason or "")


def test_cli_summary_shows_why_a_backend_declined(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    spec = "test_backend_issue19:Quiet"
    assert main(["specialize", str(src), str(dst), "--backend", spec, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{LABEL} declined: returned without writing anything" in err
    assert not dst.exists()
    argv = ["specialize", str(src), str(dst), "--backend", spec, "--allow-unchanged"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        f"backend XnnpackBackend ({spec}): declined: returned without writing anything "
        "(1 delegate inputs seen); raise NotSupported('why') to say why (data kept as is)"
    ) in out


# -- one rule for Python and the CLI: nothing specialized raises, unless opted in ----
def test_specialize_refuses_an_unchanged_copy_by_default(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "o.pte"
    with pytest.raises(NothingSpecialized, match=r"^nothing was specialized in .*model\.pte"):
        ptestore.specialize(src, dst, backends=[Quiet()])
    assert not dst.exists()
    report = ptestore.specialize(src, dst, backends=[Quiet()], allow_unchanged=True)
    assert not report.specialized and dst.read_bytes() == src.read_bytes()
    # the older spelling still works
    assert not ptestore.specialize(src, dst, backends=[Quiet()], strict=False).specialized


def test_strict_and_allow_unchanged_contradict(src: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"^strict=True and allow_unchanged=True contradict each other: pass one of them$",
    ):
        ptestore.specialize(src, tmp_path / "o.pte", strict=True, allow_unchanged=True)
    with pytest.raises(ConfigurationError, match=r"^allow_unchanged must be True or False, got 1$"):
        ptestore.specialize(src, tmp_path / "o.pte", allow_unchanged=1)  # type: ignore[arg-type]


def test_passthrough_is_still_a_deliberate_copy(src: Path, tmp_path: Path) -> None:
    report = ptestore.specialize(src, tmp_path / "o.pte", backends=["passthrough"])
    assert report.specialized and report.backends[0].status == "specialized"
