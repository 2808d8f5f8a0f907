"""The command line reference stays true to the parser: every option of every command
(sub-commands of ``fleet`` and ``cache`` included) is documented in each section that
describes its command (not only somewhere on the page: ``fleet run --no-progress`` went
unnoticed because the ``specialize`` section names ``--no-progress``), and every
``--flag`` those pages name is one the parser takes (or is listed below as what it is:
another program's flag, a deliberate misspelling)."""

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

_SHARED = ("cli.md", "## `ptestore verify`, `fleet`, `select`, `fetch`")
_FLEET_RUN = (_SHARED, ("fleet.md", "## Running"))

#: The sections that describe each command, by their heading (or its start, ending with
#: a space); a section runs to the next heading of its level or above, its sub-sections
#: part of it. An option must be named in every one. None: the whole page (device.md
#: describes ``ensure`` and ``cache`` throughout, not in a section of their own).
SECTIONS: dict[tuple[str, ...], tuple[tuple[str, str | None], ...]] = {
    (): (("cli.md", "## Options every command takes"),),
    ("inspect",): (("cli.md", "## `ptestore inspect "),),
    ("specialize",): (("cli.md", "## `ptestore specialize "),),
    ("gc",): (("cli.md", "## `ptestore gc "),),
    ("backends",): (("cli.md", "## `ptestore backends "),),
    ("verify",): (_SHARED, ("fleet.md", "## verify")),
    ("fleet",): (_SHARED,),
    ("fleet", "run"): _FLEET_RUN,
    ("fleet", "plan"): _FLEET_RUN,
    ("fleet", "retire"): (_SHARED, ("fleet.md", "## Life cycle: retire and gc")),
    ("fleet", "check-index"): (_SHARED, ("fleet.md", "### The index")),
    ("select",): (_SHARED, ("fleet.md", "### select")),
    ("fetch",): (_SHARED, ("fleet.md", "### fetch")),
    ("ensure",): (("cli.md", "## `ptestore ensure "), ("device.md", None)),
    ("cache",): (("cli.md", "## `ptestore cache "), ("device.md", None)),
}

#: Options every command takes, described once for all (cli.md's start and its
#: "Options every command takes").
COMMON = {"-h", "--help", "-v", "--verbose", "--debug", "-o", "--storage-option"}
_COMMON_TEXT = ("cli.md", "## `ptestore inspect ")  # everything before this heading

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


def _headings(lines: list[str]) -> Iterator[tuple[int, int]]:
    """``(line number, level)`` of each Markdown heading, code blocks skipped."""
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) ", line)):
            yield i, len(m.group(1))


def _heads(line: str, heading: str) -> bool:
    """``heading`` ending with a space starts the line; else it is the whole line."""
    return line.startswith(heading) if heading.endswith(" ") else line == heading


def _section(page: str, heading: str | None) -> str:
    """The section of ``page`` under ``heading`` (exactly one, see :func:`_heads`), up
    to the next heading of its level or above; None: the whole page."""
    text = _text(page)
    if heading is None:
        return text
    lines = text.splitlines()
    heads = list(_headings(lines))
    found = [(i, level) for i, level in heads if _heads(lines[i], heading)]
    assert len(found) == 1, f"docs/{page}: {len(found)} headings start with {heading!r}"
    start, level = found[0]
    end = next((i for i, lv in heads if i > start and lv <= level), len(lines))
    return "\n".join(lines[start:end])


def _common_text() -> str:
    page, heading = _COMMON_TEXT
    text = _text(page)
    return text[: text.index("\n" + heading)]


def test_every_option_of_every_command_is_documented() -> None:
    undocumented = []
    for path, action in _options(build_parser()):
        names = action.option_strings
        if set(names) & COMMON:
            where: tuple[tuple[str, str | None], ...] = (("cli.md", "(its start)"),)
            texts = [_common_text()]
        else:
            where = SECTIONS[path]
            texts = [_section(page, heading) for page, heading in where]
        for (page, heading), text in zip(where, texts, strict=True):
            if not any(_documented(o, text) for o in names):
                undocumented.append(
                    f"{' '.join(('ptestore', *path))} {'/'.join(names)} "
                    f"(docs/{page}, {heading or 'the page'})"
                )
    assert not undocumented, "options missing from docs/: " + "; ".join(undocumented)


def test_every_command_has_its_sections() -> None:
    """A new command (or ``fleet`` sub-command) is given its sections here."""
    commands = {path for path, _ in _options(build_parser())}
    assert commands == set(SECTIONS)
    for where in SECTIONS.values():
        for page, heading in where:
            assert _section(page, heading)


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
    found = [o for path, a in _options(parser) for o in a.option_strings if o == "--brand-new-flag"]
    assert found == ["--brand-new-flag"]
    assert not _documented("--brand-new-flag", _text("cli.md"))
    assert _documented("--dry-run", _text("cli.md"))
    assert not _documented("--dry", _text("cli.md"))
    # Per section: named on the page, for another command, is not documented for this one.
    gc = _section("cli.md", "## `ptestore gc ")
    assert _documented("--allow-unchanged", _text("cli.md"))
    assert not _documented("--allow-unchanged", gc)
    assert _documented("--older-than", gc)
    assert "## `ptestore ensure " not in gc  # the section ends at the next heading
