"""The test environment's lock (requirements/test.txt) agrees with pyproject.toml.

scripts/test.sh installs the lock, not the extras: a requirement added to or tightened in
pyproject.toml without `bash scripts/lock.sh` would otherwise go untested.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements" / "test.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(\S+)", line)
        if match:
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def test_every_requirement_of_the_extras_is_locked_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("s3", "interop", "fleet", "test"):
        wanted += project["optional-dependencies"][extra]
    pins = _locked()
    problems = []
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{text}: not in requirements/test.txt")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{text}: locked at {pins[name]}")
    assert not problems, "run `bash scripts/lock.sh`:\n" + "\n".join(problems)


def test_the_lock_pins_the_cpu_build_of_torch() -> None:
    assert _locked()["torch"].local == "cpu"
