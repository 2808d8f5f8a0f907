"""What a device profile can hold: values that JSON records as they are (no nan or
infinity, no integer Python cannot turn into text, string keys) and a name without NUL;
refused up front as bad input (exit 2), naming the option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.backends import DeviceProfile
from ptestore.backends.compat import canonical_json, parse_device_options
from ptestore.cli import main
from ptestore.cli.exits import EXIT_BAD_INPUT
from ptestore.errors import ConfigurationError

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
JSON_ONLY = "(trailers and the index are JSON, which has no nan or inf)"


def test_a_nul_in_a_device_name_is_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        DeviceProfile("pixel\x009", {})
    assert str(info.value) == (
        "device name 'pixel\\x009' contains a NUL character (\\x00): programs get it as "
        "text (the command backend's PTESTORE_DEVICE), which cannot hold one"
    )


def test_a_nul_in_a_device_name_is_bad_input_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["specialize", str(MLP.pte_path), str(tmp_path / "o.pte")]
    argv += ["--backend", "command@XnnpackBackend=cat", "--device", "pixel\x009"]
    assert main(argv) == EXIT_BAD_INPUT
    assert "contains a NUL character" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"threshold": float("nan")},
            f"device 'd' option 'threshold' must be a finite number, got nan {JSON_ONLY}",
        ),
        (
            {"a": {"b": [1, float("-inf")]}},
            f"device 'd' option 'a.b[1]' must be a finite number, got -inf {JSON_ONLY}",
        ),
        (
            {"n": 10**5000},
            "device 'd' option 'n' is an integer of more than 4300 digits, which Python "
            "does not turn into text (sys.get_int_max_str_digits()): give it as a string",
        ),
        (
            {1: "a", "1": "b"},
            "device 'd' option '1': keys must be strings, got int 1 (JSON's are)",
        ),
        (
            {"a": {2: "x"}},
            "device 'd' option 'a.2': keys must be strings, got int 2 (JSON's are)",
        ),
    ],
)
def test_options_json_cannot_record_are_refused(options: dict[Any, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        DeviceProfile("d", options)
    assert str(info.value) == message


def test_canonical_json_writes_standard_json_only() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        canonical_json({"a": float("nan")})


def not_finite(pair: str, token: str) -> tuple[str, str]:
    return pair, f"--device-option {pair!r}: {token} is not a finite number {JSON_ONLY}"


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        not_finite("threshold=NaN", "NaN"),
        not_finite("t=-Infinity", "-Infinity"),
        not_finite("t=[1,NaN]", "NaN"),
        not_finite("t=1e999", "1e999"),
        (
            "n=" + "9" * 5000,
            "--device-option 'n=" + "9" * 55 + "...': an integer of 5000 digits is more than "
            "Python converts (4300 digits, sys.get_int_max_str_digits()): give it as a JSON "
            "string (KEY='\"...\"') to keep it as text",
        ),
    ],
)
def test_parse_device_options_refuses_what_json_cannot_hold(pair: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_device_options([pair])
    assert str(info.value) == message


def test_parse_device_options_keeps_what_it_kept() -> None:
    assert parse_device_options(["soc=sm8650", "n=4", "f=1.5", "s=NaNa", 'q="NaN"']) == {
        "soc": "sm8650",
        "n": 4,
        "f": 1.5,
        "s": "NaNa",
        "q": "NaN",
    }
    big = "9" * 5000
    assert parse_device_options([f'n="{big}"']) == {"n": big}


def test_nan_on_the_command_line_is_bad_input_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    argv = ["specialize", str(MLP.pte_path), str(dst), "--backend", "command@XnnpackBackend=cat"]
    argv += ["--device", "pixel", "--device-option", "threshold=NaN", "--json"]
    assert main(argv) == EXIT_BAD_INPUT
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"].endswith(f"NaN is not a finite number {JSON_ONLY}")
    assert not dst.exists()
