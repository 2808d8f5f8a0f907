"""``ensure(..., xnnpack_cache=True)``'s ``xnnpack_retry`` and ``xnnpack_timeout`` (CLI
``--xnnpack-retry``, ``--xnnpack-timeout``): checked before anything is done, and handed
to the maker (``make_cache``, replaced here: the real runtime's refusals are in
tests/xnnpack/test_refusal.py): a default timeout, ``retry_refused``; a failure that may
pass is served as a refusal and tried again at the next call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ptestore.xnnpack
from ptestore.cli import main
from ptestore.device import ensure
from ptestore.errors import ConfigurationError, PackedWeightsRefused

MLP = Path(__file__).parents[1] / "fixtures" / "mlp_xnnpack.pte"


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "10", True])
def test_a_bad_timeout_is_refused_before_anything(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ensure(MLP, cache_dir=tmp_path / "c", xnnpack_cache=True, xnnpack_timeout=bad)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"xnnpack_timeout must be a number of seconds > 0 or None, got {bad!r}"
    )
    with pytest.raises(ConfigurationError, match="xnnpack_retry must be True or False, got 1"):
        ensure(MLP, cache_dir=tmp_path / "c", xnnpack_cache=True, xnnpack_retry=1)  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_the_cli_refuses_a_timeout_of_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ensure", str(MLP), "--cache-dir", str(tmp_path / "c"), "--xnnpack-cache"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--xnnpack-timeout", "0"])
    assert info.value.code == 2
    assert "expected a number of seconds > 0, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--xnnpack-retry"], "--xnnpack-retry applies"),
        (["--xnnpack-timeout", "60"], "--xnnpack-timeout applies"),
        (
            ["--xnnpack-retry", "--xnnpack-timeout", "60"],
            "--xnnpack-retry and --xnnpack-timeout apply",
        ),
    ],
)
def test_the_cli_refuses_retry_and_timeout_without_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    """Without --xnnpack-cache they were accepted and ignored; refused (exit 2, before
    anything is done), as ``cache`` refuses a flag of another action."""
    cache_dir = tmp_path / "c"
    cache_dir.mkdir()
    assert main(["ensure", str(MLP), "--cache-dir", str(cache_dir), *flags]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"ptestore ensure: error: {named} to the XNNPACK packed-weight file "
        "--xnnpack-cache makes: add --xnnpack-cache\n",
    )
    assert list(cache_dir.iterdir()) == []


def test_the_timeout_and_retry_reach_the_maker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("executorch", reason="the [xnnpack] extra")
    calls: list[dict[str, Any]] = []

    def make_cache(pte: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise PackedWeightsRefused(str(pte), "the runtime did not finish", transient=True)

    monkeypatch.setattr(ptestore.xnnpack, "make_cache", make_cache, raising=False)
    cache_dir = tmp_path / "c"
    got = ensure(MLP, cache_dir=cache_dir, xnnpack_cache=True)
    assert got.xnnpack_cache is None and got.xnnpack_refused == "the runtime did not finish"
    assert calls[-1]["timeout"] == 3600.0 and calls[-1]["retry_refused"] is False
    again = ensure(
        MLP, cache_dir=cache_dir, xnnpack_cache=True, xnnpack_retry=True, xnnpack_timeout=5
    )
    assert again.xnnpack_refused == "the runtime did not finish"  # tried again: 2 calls
    assert len(calls) == 2
    assert calls[-1]["timeout"] == 5 and calls[-1]["retry_refused"] is True
    argv = ["ensure", str(MLP), "--cache-dir", str(cache_dir), "--xnnpack-cache"]
    assert main([*argv, "--xnnpack-retry", "--xnnpack-timeout", "7.5"]) == 0
    assert calls[-1]["timeout"] == 7.5 and calls[-1]["retry_refused"] is True


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"xnnpack_retry": True}, "xnnpack_retry=True applies"),
        ({"xnnpack_timeout": 60.0}, "xnnpack_timeout applies"),
        (
            {"xnnpack_retry": True, "xnnpack_timeout": 60},
            "xnnpack_retry=True and xnnpack_timeout apply",
        ),
    ],
)
def test_the_api_refuses_retry_and_timeout_without_the_cache(
    tmp_path: Path, kwargs: dict[str, Any], named: str
) -> None:
    """From Python as from the CLI: without ``xnnpack_cache=True`` they were accepted and
    ignored; refused before anything is done."""
    with pytest.raises(ConfigurationError) as info:
        ensure(MLP, cache_dir=tmp_path / "c", **kwargs)
    assert str(info.value) == (
        f"{named} to the XNNPACK packed-weight file xnnpack_cache=True makes: add "
        "xnnpack_cache=True (CLI: --xnnpack-cache)"
    )
    assert not (tmp_path / "c").exists()
