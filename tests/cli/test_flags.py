"""Issue 26, part 6: the flags the sub-commands share are built in one place
(``ptestore/cli/options.py``) and mean the same in every command: the same syntax,
default and destination, and the same error, exit 2, for the same mistake."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.cli import build_parser, main
from ptestore.cli.exits import EXIT_BAD_INPUT

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
SRC = str(MLP.pte_path)

#: A command line of each command taking the flag, without the flag.
BACKEND = {
    "specialize": ["specialize", "a.pte", "b.pte"],
    "ensure": ["ensure", "a.pte", "--cache-dir", "c"],
    "verify": ["verify", "a.pte"],
}
DEVICE = {
    **BACKEND,
    "select": ["select", "i.json", "--model", "m"],
    "fetch": ["fetch", "i.json", "out.pte"],
}
PTD_ONE = {
    "inspect": ["inspect", "a.pte"],
    "verify": ["verify", "a.pte"],
    "ensure": ["ensure", "a.pte", "--cache-dir", "c"],
}
STORAGE = ["inspect", "specialize", "gc", "verify", "select", "fetch", "ensure"]


def _action(command: str, flag: str) -> argparse.Action:
    parser = build_parser().commands[command]
    found = [a for a in parser._actions if flag in a.option_strings]
    assert len(found) == 1, (command, flag)
    return found[0]


def _shape(action: argparse.Action) -> tuple[object, ...]:
    return (
        tuple(action.option_strings),
        action.dest,
        action.nargs,
        repr(action.default),
        action.metavar,
        action.type,
        type(action),
    )


@pytest.mark.parametrize(
    ("flag", "commands"),
    [
        ("--backend", BACKEND),
        ("--device", DEVICE),
        ("--device-option", DEVICE),
        ("--ptd", PTD_ONE),
        ("-o", dict.fromkeys(STORAGE)),
    ],
)
def test_a_shared_flag_has_one_shape_everywhere(flag: str, commands: dict[str, object]) -> None:
    shapes = {command: _shape(_action(command, flag)) for command in commands}
    assert len(set(shapes.values())) == 1, shapes


def test_the_ptd_pair_of_specialize_is_the_one_other_shape() -> None:
    action = _action("specialize", "--ptd")
    assert (action.nargs, action.metavar, action.dest) == (2, ("SRC_PTD", "DST_PTD"), "ptd")
    ns = build_parser().parse_args(["specialize", "a.pte", "b.pte", "--ptd", "a.ptd", "b.ptd"])
    assert ns.ptd == ["a.ptd", "b.ptd"]
    from ptestore.cli.options import ptd_pair

    assert ptd_pair(ns) == ("a.ptd", "b.ptd")
    assert ptd_pair(build_parser().parse_args(["specialize", "a.pte", "b.pte"])) is None


@pytest.mark.parametrize("command", sorted(DEVICE))
def test_the_same_flags_parse_to_the_same_values(command: str) -> None:
    argv = [*DEVICE[command], "--device", "phone", "--device-option", "soc=sm8650"]
    argv += ["--device-option", "threads=4"]
    if command in BACKEND:
        argv += ["--backend", "passthrough", "--backend", "command=x"]
    ns = build_parser().parse_args(argv)
    assert (ns.device, ns.device_option) == ("phone", ["soc=sm8650", "threads=4"])
    if command in BACKEND:
        assert ns.backend == ["passthrough", "command=x"]
    from ptestore.cli.options import device_or_name, device_profile

    profile = device_profile(ns)
    assert profile is not None
    assert (profile.name, dict(profile.options)) == ("phone", {"soc": "sm8650", "threads": 4})
    assert device_or_name(ns) == profile
    bare = build_parser().parse_args([*DEVICE[command], "--device", "phone"])
    assert device_or_name(bare) == "phone"
    bare_profile = device_profile(bare)
    assert bare_profile is not None and dict(bare_profile.options) == {}


def _argv_with(command: str, *flags: str, tmp_path: Path) -> list[str]:
    """A command line of ``command`` that reaches the device's check (real files where
    the command reads them before it)."""
    lines = {
        "specialize": ["specialize", SRC, str(tmp_path / "o.pte"), "--backend", "passthrough"],
        "ensure": ["ensure", SRC, "--cache-dir", str(tmp_path / "cache")],
        "verify": ["verify", SRC],
        "select": ["select", str(tmp_path / "i.json"), "--model", "m"],
        "fetch": ["fetch", str(tmp_path / "i.json"), str(tmp_path / "o.pte")],
    }
    return [*lines[command], *flags]


_MISTAKES = {
    "option-without-device": (["--device-option", "soc=x"], "--device-option needs --device NAME"),
    "option-without-value": (
        ["--device", "phone", "--device-option", "soc"],
        "--device-option: expected KEY=VALUE, got 'soc'",
    ),
}


@pytest.mark.parametrize(
    ("command", "mistake"),
    [
        (command, mistake)
        for command in sorted(DEVICE)
        for mistake in _MISTAKES
        # select requires --device: argparse refuses that command line first (below)
        if (command, mistake) != ("select", "option-without-device")
    ],
)
def test_the_same_device_mistake_is_the_same_error(
    command: str, mistake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, message = _MISTAKES[mistake]
    assert main(_argv_with(command, *flags, tmp_path=tmp_path)) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert message in captured.err + captured.out, captured
    assert not (tmp_path / "o.pte").exists()
    assert not (tmp_path / "cache").exists()


def test_select_without_device_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["select", "i.json", "--model", "m", "--device-option", "soc=x"])
    assert info.value.code == EXIT_BAD_INPUT
    assert "the following arguments are required: --device" in capsys.readouterr().err
