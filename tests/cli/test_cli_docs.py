"""The command line reference stays true to the parser: every option of every command
(sub-commands of ``fleet`` and ``cache`` included) is documented in the page that
describes its command, and every ``--flag`` those pages name is one the parser takes
(or is listed below as what it is: another program's flag, a deliberate misspelling)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from ptestore.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Where each command's options are described (docs/cli.md points to the others).
PAGES = {
    "fleet": ("cli.md", "fleet.md"),
    "verify": ("cli.md", "fleet.md"),
    "select": ("cli.md", "fleet.md"),
    "fetch": ("cli.md", "fleet.md"),
    "ensure": ("cli.md", "device.md"),
    "cache": ("cli.md", "device.md"),
}

#: ``--flags`` in those pages that are not ptestore's, and why.
NOT_OURS = {
    "--alow-unchanged": "cli.md shows the suggestion a misspelt flag gets",
    "--htp-v75": "a device's compiler flag in fleet.md's example job",
    "--nworkers": "dask worker's own flag (fleet.md, Dask set-up)",
    "--nthreads": "dask worker's own flag (fleet.md, Dask set-up)",
}

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _options(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield path, action


def _text(*pages: str) -> str:
    return "\n".join((DOCS / page).read_text(encoding="utf-8") for page in pages)


def _documented(option: str, text: str) -> bool:
    return re.search(re.escape(option) + r"(?![\w-])", text) is not None


def test_every_option_of_every_command_is_documented() -> None:
    undocumented = []
    for path, action in _options(build_parser()):
        pages = PAGES.get(path[0], ("cli.md",)) if path else ("cli.md",)
        text = _text(*pages)
        if not any(_documented(o, text) for o in action.option_strings):
            where = " ".join(("ptestore", *path))
            undocumented.append(f"{where} {'/'.join(action.option_strings)} ({', '.join(pages)})")
    assert not undocumented, "options missing from docs/: " + "; ".join(undocumented)


def test_every_flag_the_reference_names_exists() -> None:
    taken = {o for _, action in _options(build_parser()) for o in action.option_strings}
    taken |= {"--help"}
    unknown = []
    for page in sorted({p for pages in PAGES.values() for p in pages}):
        for flag in sorted(set(FLAG.findall(_text(page))) - taken - set(NOT_OURS)):
            unknown.append(f"docs/{page}: {flag}")
    assert not unknown, "flags no command takes: " + "; ".join(unknown)


def test_the_check_finds_a_missing_option() -> None:
    """The first test can fail: an option added to a command is found undocumented."""
    parser = build_parser()
    parser.commands["gc"].add_argument("--brand-new-flag", help="x")
    found = [
        o for path, a in _options(parser) for o in a.option_strings if o == "--brand-new-flag"
    ]
    assert found == ["--brand-new-flag"]
    assert not _documented("--brand-new-flag", _text("cli.md"))
    assert _documented("--dry-run", _text("cli.md"))
    assert not _documented("--dry", _text("cli.md"))
