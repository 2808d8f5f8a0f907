"""Storage decisions have one home each, checked from the source (nothing imported):

(a) renaming and fsyncing (``os.replace``, ``os.rename``, ``os.fsync``, ``os.fdatasync``)
    happen in ``ptestore/writers/`` (the transactional writers) and in
    ``ptestore/storage/atomic.py`` (small files, and the durability primitives) only;
(b) "is this URL local, and where?" is answered by ``ptestore/storage/`` only
    (:class:`~ptestore.storage.types.StorageURL`): no hand-written ``file://`` prefix
    test, ``"://" in`` check or ``protocol == "file"`` comparison elsewhere;
(c) the storage layer sits below the writers: no module of ``ptestore/storage/`` imports
    ``ptestore.writers`` (the scheme table names writer classes by string).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .test_house_imports import MODULES, import_graph

ROOT = Path(__file__).resolve().parents[2]

#: (a) Modules allowed to rename or fsync besides the homes, and why.
SYNC_ALLOWED: dict[str, str] = {}

#: (b) Lines outside ptestore/storage/ that look like URL classification and are not.
URL_ALLOWED: dict[tuple[str, str], str] = {
    # A chained fsspec URL (``simplecache::s3://...``): each link's protocol, for the
    # option names; not a local/remote decision (writers/ is helper cas's).
    ("ptestore/writers/generic.py", 'protocol = split_url(link)[0] if "://" in link else link'): (
        "chained fsspec URLs"
    ),
    # What a URL shows (its credentials redacted) is asked below the storage layer too
    # (the logger's and the errors' messages): a message without a URL is left alone.
    ("ptestore/_redact.py", 'return "://" in text'): "redaction's fast path",
    # A memory path given without its scheme gets it back (a name for messages).
    ("ptestore/writers/memory.py", 'super().__init__(url if "://" in url else'): (
        "memory:// names"
    ),
}

_SYNC_CALLS = {"replace", "rename", "renames", "fsync", "fdatasync"}
_URL_PATTERNS = [
    re.compile(p)
    for p in (
        r"""startswith\(\s*["']file:""",
        r"""removeprefix\(\s*["']file:""",
        r"""["']://["']\s+(not\s+)?in\b""",
        r"""[=!]=\s*["']file["']""",
        r"""["']file["']\s*[=!]=""",
        r"""\[len\(\s*["']file://""",
    )
]


def _source_files() -> list[Path]:
    return sorted((ROOT / "ptestore").rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _sync_calls(path: Path) -> list[str]:
    """``os.<call>(...)`` and ``from os import <call>`` uses in ``path``."""
    return _sync_calls_in(path.read_text(), _rel(path))


def _sync_calls_in(text: str, rel: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text, rel)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _SYNC_CALLS
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{rel}:{node.lineno}: os.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in _SYNC_CALLS:
                    found.append(f"{rel}:{node.lineno}: from os import {alias.name}")
    return found


def _sync_home(rel: str) -> bool:
    return rel.startswith("ptestore/writers/") or rel == "ptestore/storage/atomic.py"


def test_only_the_writers_and_the_atomic_helper_rename_or_fsync() -> None:
    found = []
    for path in _source_files():
        rel = _rel(path)
        if _sync_home(rel) or rel in SYNC_ALLOWED:
            continue
        found += _sync_calls(path)
    assert found == []


def test_the_sync_allow_list_is_still_needed() -> None:
    """An entry that no longer renames or fsyncs leaves the list."""
    for rel in SYNC_ALLOWED:
        assert _sync_calls(ROOT / rel), f"{rel} no longer renames or fsyncs: drop it"


def test_the_checker_sees_every_spelling() -> None:
    text = "import os\nfrom os import replace\nos.fsync(1)\nos.rename('a', 'b')\n"
    assert sorted(f.split(": ", 1)[1] for f in _sync_calls_in(text, "probe.py")) == [
        "from os import replace",
        "os.fsync",
        "os.rename",
    ]
    for line in (
        'if url.startswith("file://"):',
        "x = url.removeprefix('file://')",
        'if "://" not in text:',
        'return "://" in url',
        'if protocol == "file":',
        'if split_url(u)[0] != "file":',
        'return url[len("file://") :]',
    ):
        assert any(p.search(line) for p in _URL_PATTERNS), line
    assert not any(p.search("u = StorageURL.of(url)\nif u.local:") for p in _URL_PATTERNS)


def _url_lines(path: Path) -> list[tuple[str, int, str]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if any(p.search(code) for p in _URL_PATTERNS):
            out.append((_rel(path), n, line.strip()))
    return out


def _url_allowed(rel: str, line: str) -> bool:
    return any(rel == r and snippet in line for r, snippet in URL_ALLOWED)


def test_urls_are_classified_in_the_storage_layer_only() -> None:
    found = []
    for path in _source_files():
        rel = _rel(path)
        if rel.startswith("ptestore/storage/"):
            continue
        found += [
            f"{r}:{n}: {line}" for r, n, line in _url_lines(path) if not _url_allowed(r, line)
        ]
    assert found == []


def test_the_url_allow_list_is_still_needed() -> None:
    for rel, snippet in URL_ALLOWED:
        lines = [line for _, _, line in _url_lines(ROOT / rel)]
        assert any(snippet in line for line in lines), f"{rel}: {snippet!r} is gone: drop it"


def test_storage_imports_no_writer() -> None:
    """Storage is below the writers: the scheme table reaches a writer class through its
    ``"module:Class"`` string, routing through the table."""
    graph = import_graph()
    found = sorted(
        f"{module} -> {target}"
        for module in MODULES
        if module == "ptestore.storage" or module.startswith("ptestore.storage.")
        for target in graph[module]
        if target == "ptestore.writers" or target.startswith("ptestore.writers.")
    )
    assert found == []
