"""Plant each bug of issue 12's audit table in a copy of the tree and run the tests
that must catch it; exit 1 if any bug survives (docs/testing.md).

    python scripts/planted_bugs.py            # every bug, its own test selection
    python scripts/planted_bugs.py --list     # the bugs and their selections
    python scripts/planted_bugs.py NAME ...   # some of them

Each bug is a literal text replacement in one module (checked to apply exactly once),
run in a fresh copy of ``ptestore/`` and ``tests/`` under a temporary directory, so the
working tree is never touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bug:
    name: str
    path: str
    #: ``(old, new)`` text replacements, each applying exactly once.
    edits: tuple[tuple[str, str], ...]
    tests: tuple[str, ...]


BUGS = (
    Bug(
        "redirect-offset-plus-one",
        "ptestore/format/patch.py",
        (
            (
                "out.extend(U64.pack(new_off) + U64.pack(new_size))",
                "out.extend(U64.pack(new_off + 1) + U64.pack(new_size))",
            ),
        ),
        ("tests/interop/test_specialize_redirect.py",),
    ),
    Bug(
        "directory-fsync-skipped",
        "ptestore/writers/local.py",
        (("        if self.durable:\n            self._fsync_directory()", "        pass"),),
        ("tests/writers/test_durability_order.py",),
    ),
    Bug(
        "staging-fsync-skipped",
        "ptestore/writers/local.py",
        (("                _full_fsync(fd)\n", "                pass\n"),),
        ("tests/writers/test_durability_order.py",),
    ),
    Bug(
        "publish-in-place-not-rename",
        "ptestore/writers/local.py",
        (
            ("import os\n", "import os\nimport shutil\n"),
            (
                "                os.replace(tmp, self.path)",
                "                shutil.copyfile(tmp, self.path)\n                os.unlink(tmp)",
            ),
        ),
        ("tests/writers/test_durability_order.py",),
    ),
    Bug(
        "alignment-capped-at-64",
        "ptestore/format/layout.py",
        (
            (
                "original = inferred_alignment(old_abs) if has_base else 1",
                "original = min(64, inferred_alignment(old_abs)) if has_base else 1",
            ),
        ),
        ("tests/format/test_layout.py",),
    ),
    Bug(
        "s3-abort-skipped-on-discard",
        "ptestore/writers/s3/staging.py",
        (("        if upload_id is not None:\n            self.abort(upload_id)", "        pass"),),
        ("tests/writers/test_contract_s3.py", "-k", "test_discard"),
    ),
    Bug(
        "s3-no-if-none-match-on-complete",
        "ptestore/writers/s3/publish.py",
        (
            (
                "        extra: dict[str, Any] = dict(self.conn.extras)\n"
                '        if mode == "create":\n'
                '            extra["IfNoneMatch"] = "*"',
                "        extra: dict[str, Any] = dict(self.conn.extras)",
            ),
        ),
        ("tests/writers/test_contract_s3.py", "-k", "create_refuses_existing_large"),
    ),
    Bug(
        # the check, then the commit point, then a rename that replaces
        "local-create-as-check-then-rename",
        "ptestore/writers/local.py",
        (
            (
                "        self._commit_point()\n",
                '        if mode == "create" and os.path.exists(self.path):\n'
                '            raise AlreadyExists(f"{self.path}: already exists; '
                "publish(mode='create') never replaces\")\n"
                "        self._commit_point()\n",
            ),
            (
                "                os.link(tmp, self.path)",
                "                os.replace(tmp, self.path)",
            ),
        ),
        ("tests/writers/test_contract_local.py", "-k", "forced_interleaving"),
    ),
    Bug(
        "memory-create-checked-outside-the-lock",
        "ptestore/writers/memory.py",
        (
            (
                "        self._commit_point()  #",
                "        exists = path in fs.store\n        self._commit_point()  #",
            ),
            ('if mode == "create" and path in fs.store:', 'if mode == "create" and exists:'),
        ),
        ("tests/writers/test_contract_memory.py", "-k", "forced_interleaving"),
    ),
)


def plant(bug: Bug, tree: Path) -> None:
    target = tree / bug.path
    text = target.read_text()
    for old, new in bug.edits:
        if text.count(old) != 1:
            raise SystemExit(f"{bug.name}: {old!r} occurs {text.count(old)} times")
        text = text.replace(old, new)
    target.write_text(text)


def run(bug: Bug) -> bool:
    """True if the planted bug made the selection fail."""
    with tempfile.TemporaryDirectory(prefix=f"planted-{bug.name}-") as tmp:
        tree = Path(tmp)
        for name in ("ptestore", "tests"):
            shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
        plant(bug, tree)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PTESTORE_REQUIRE_INTEROP", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *bug.tests]
        result = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
        caught = result.returncode == 1
        print(f"{'caught  ' if caught else 'SURVIVED'} {bug.name}: {summary}", flush=True)
        why = [line for line in result.stdout.splitlines() if line.startswith("E ")]
        if why:
            print(f"         {why[0][:150]}", flush=True)
        if result.returncode not in (0, 1):
            print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
        return caught


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="bugs to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the bugs")
    args = parser.parse_args()
    bugs = [b for b in BUGS if not args.names or b.name in args.names]
    if args.list:
        for b in BUGS:
            print(f"{b.name:<40} {b.path:<32} {' '.join(b.tests)}")
        return 0
    survived = [b.name for b in bugs if not run(b)]
    if survived:
        print(f"survived: {', '.join(survived)}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
