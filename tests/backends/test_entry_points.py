"""Entry points of the group ``ptestore.backends`` as installed distributions declare
them: a name two distributions declare is listed once per declaration, with an error,
and refused by ``--backend NAME`` and the default selection, naming both; the version
listed is what provenance records (the loaded class's, converted by the same function:
``version = 2`` is "2" in both); another distribution's entry point named as a
built-in (``passthrough``, ``command``) is listed with why it is not used (it was
dropped silently), and the built-in keeps the name."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendInterface,
    installed_backends,
    load_backend,
    register_backend,
    unregister_backend,
)
from ptestore.backends.command import CommandBackend
from ptestore.backends.passthrough import PassthroughBackend
from ptestore.backends.registry import BUILTIN_BACKENDS
from ptestore.backends.snapshot import using
from ptestore.cli import main
from ptestore.cli.exits import EXIT_FAILURE
from ptestore.errors import ConfigurationError
from ptestore.provenance import read_provenance
from ptestore.storage.loaders import open_loader

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None

BACKEND = """\
from ptestore.backends import BackendInterface, NotSupported

class {cls}(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context, output):
        raise NotSupported("demo")

def make():
    return {cls}()
"""


def dist(site: Path, name: str, version: str, tops: list[str], eps: dict[str, str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("".join(f"{t}\n" for t in tops))
    (info / "RECORD").write_text("")
    if eps:
        lines = "".join(f"{k} = {v}\n" for k, v in eps.items())
        (info / "entry_points.txt").write_text(f"[ptestore.backends]\n{lines}")


def package(site: Path, top: str, cls: str) -> None:
    (site / top).mkdir(parents=True)
    (site / top / "__init__.py").write_text("")
    (site / top / "ptestore.py").write_text(BACKEND.format(cls=cls))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A site directory on ``sys.path`` and a unique suffix for its names (the version
    lookups and imported modules of one test never answer for another's)."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path, uuid.uuid4().hex[:8]


def test_a_name_two_distributions_declare_is_refused_naming_both(
    site: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, u = site
    package(path, f"acme_npu_{u}", "Npu")
    package(path, f"other_npu_{u}", "Other")
    name = f"acme{u}"
    dist(path, f"zz_plugin_{u}", "9.9", [f"other_npu_{u}"], {name: f"other_npu_{u}.ptestore:Other"})
    dist(path, f"acme_plugin_{u}", "1.2", [], {name: f"acme_npu_{u}.ptestore:Npu"})
    why = (
        f"the entry point name {name!r} (group ptestore.backends) is declared by 2 "
        f"distributions, acme_plugin_{u} 1.2 (acme_npu_{u}.ptestore:Npu) and zz_plugin_{u} "
        f"9.9 (other_npu_{u}.ptestore:Other): which one is meant is unknown; uninstall "
        "one, or name the class by its import path (package.module:attr)"
    )
    listed = [b for b in installed_backends() if b.name == name]
    assert [(b.spec, b.version, b.error) for b in listed] == [
        (f"acme_npu_{u}.ptestore:Npu", "1.2", why),
        (f"other_npu_{u}.ptestore:Other", "9.9", why),
    ]
    with pytest.raises(ConfigurationError) as info:
        load_backend(name)
    assert str(info.value) == f"backend {name!r}: {why}"
    with pytest.raises(ConfigurationError) as info:  # the default selection
        ptestore.specialize(MLP.pte_path, tmp_path / "o.pte")
    assert str(info.value) == f"backend {name!r}: {why}"
    assert main(["backends", "--json"]) == EXIT_FAILURE
    rows = [r for r in json.loads(capsys.readouterr().out) if r["name"] == name]
    assert [r["error"] for r in rows] == [why, why]
    # a snapshot remembers both declarations
    snap = tmp_path / "backends.json"
    for _ in range(2):
        with using(str(snap)):
            assert [b.error for b in installed_backends() if b.name == name] == [why, why]


def test_the_version_listed_is_the_one_provenance_records(site: tuple[Path, str]) -> None:
    path, u = site
    package(path, f"acme_npu_{u}", "Npu")
    dist(path, f"acme_npu_{u}", "3.4", [f"acme_npu_{u}"], {})
    dist(
        path,
        f"acme_plugin_{u}",
        "1.2",
        [],
        {
            f"cls{u}": f"acme_npu_{u}.ptestore:Npu",
            f"factory{u}": f"acme_npu_{u}.ptestore:make",
            f"broken{u}": f"acme_npu_{u}.nowhere:Npu",
        },
    )
    found = {b.name: b for b in installed_backends()}
    # the class: its distribution's version, as BackendInterface.version says
    assert found[f"cls{u}"].version == "3.4" == load_backend(f"cls{u}").version
    # a factory cannot be asked without calling it, nor can an entry that does not load:
    # the version of the distribution declaring them
    assert found[f"factory{u}"].version == "1.2"
    assert found[f"broken{u}"].version == "1.2"
    assert found[f"broken{u}"].error is not None


class IntVersion(BackendInterface):
    """``version = 2``: an int (or a tuple, or a ``packaging`` Version)."""

    name = "XnnpackBackend"
    version = 2  # type: ignore[assignment]

    def initialize_backend_data(self, context: object, output: object) -> None:
        named = context.get_named_data_map()  # type: ignore[attr-defined]
        key = sorted(named)[0]
        output.write_named_data(  # type: ignore[attr-defined]
            key, BackendData(bytes(named.get_data(key))[::-1])
        )


class PropertyVersion(IntVersion):
    @property
    def version(self) -> str:  # type: ignore[override]
        return "from-a-property"  # read on an instance only


def test_a_version_that_is_not_a_str_is_listed_as_provenance_records_it(
    tmp_path: Path,
) -> None:
    """``installed_backends()`` listed ``version = 2`` as the distribution's version
    ('unknown'), provenance recorded '2': one conversion for both."""
    registered = {"int-class": IntVersion, "int-instance": IntVersion(), "prop": PropertyVersion}
    for name, obj in registered.items():
        register_backend(obj, name)
    try:
        found = {b.name: b.version for b in installed_backends() if b.name in registered}
        out = tmp_path / "o.pte"
        ptestore.specialize(MLP.pte_path, out, backends=["int-class"])  # type: ignore[arg-type]
        loader = open_loader(str(out))
        try:
            record = read_provenance(loader)
        finally:
            loader.close()
    finally:
        for name in registered:
            unregister_backend(name)
    assert record is not None
    assert [r.version for r in record.requested] == [b.version for b in record.backends]
    assert found["int-class"] == record.requested[0].version == "2"
    assert found["int-instance"] == "2"
    # a property cannot be read on a class: the default (no distribution provides the
    # tests' modules)
    assert found["prop"] == "unknown"


def test_an_entry_point_named_as_a_built_in_is_listed_and_the_built_in_keeps_the_name(
    site: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, u = site
    package(path, f"acme_npu_{u}", "Npu")
    value = f"acme_npu_{u}.ptestore:Npu"
    dist(path, f"acme_plugin_{u}", "1.2", [], {"passthrough": value, "command": value})
    found = [(b.name, b.spec, b.error) for b in installed_backends()]
    for name in ("passthrough", "command"):
        assert (name, BUILTIN_BACKENDS[name], None) in found
        assert (
            name,
            value,
            f"the name {name!r} is ptestore's built-in backend ({BUILTIN_BACKENDS[name]}), "
            f"which keeps it: this entry point of acme_plugin_{u} 1.2 ({value}) is not "
            f"used; give it by its import path ({value}) or declare it under another name",
        ) in found
    assert isinstance(load_backend("passthrough"), PassthroughBackend)
    assert isinstance(load_backend("command=true"), CommandBackend)
    # the listing says it (and fails, as for any entry point that is not used)
    assert main(["backends"]) == EXIT_FAILURE
    assert f"is not used; give it by its import path ({value})" in capsys.readouterr().out


@pytest.mark.parametrize("value", [".npu:Npu", ":Npu", " .npu.sub : Npu [extra]"])
def test_an_entry_point_without_an_absolute_module_is_bad_input(
    site: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """A value naming a relative module or none (``importlib`` raised TypeError or
    ValueError, reported as the backend's failure, exit 1): the distribution's
    declaration is wrong, a ConfigurationError (exit 2) naming the entry point."""
    path, u = site
    name = f"rel{u}"
    dist(path, f"rel_plugin_{u}", "1.0", [], {name: value})
    why = (
        f"backend {name!r}: entry point {value.strip()!r} names no absolute module "
        "(package.module:attr, importable from sys.path): its distribution declares it "
        "wrongly"
    )
    with pytest.raises(ConfigurationError) as info:
        load_backend(name)
    assert str(info.value) == why
    out = tmp_path / "o.pte"
    assert main(["specialize", str(MLP.pte_path), str(out), "--backend", name]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"ptestore specialize: error: {why}"
    assert not out.exists()


def test_a_snapshot_others_could_write_is_not_trusted(
    site: tuple[Path, str], tmp_path: Path
) -> None:
    """The cache's ``backends.json`` names entry points that get imported: it is written
    without group or others' write whatever the umask, and one that group or others can
    write (a cache made under umask 002 before that) is read from the installation
    again and replaced, so an entry point planted in it is never listed or imported."""
    path, u = site
    package(path, f"acme_npu_{u}", "Npu")
    dist(path, f"acme_plugin_{u}", "1.2", [], {f"acme{u}": f"acme_npu_{u}.ptestore:Npu"})
    for p in [path, *path.rglob("*")]:  # settled: a stamp newer than a few seconds is not kept
        os.utime(p, (1e9, 1e9))
    snap = tmp_path / "backends.json"
    old = os.umask(0o002)
    try:
        with using(str(snap)):
            installed_backends()
    finally:
        os.umask(old)
    assert stat.S_IMODE(snap.stat().st_mode) == 0o644
    planted = json.loads(snap.read_text())
    evil = f"evil{u}"
    planted["facts"]["entry_points"][evil] = [[f"evil_{u}:E", "1.0", "evil"]]
    snap.write_text(json.dumps(planted))
    with using(str(snap)):  # this user's alone: trusted as it is
        assert evil in [b.name for b in installed_backends()]
    snap.chmod(0o664)
    with using(str(snap)):
        assert evil not in [b.name for b in installed_backends()]
    assert stat.S_IMODE(snap.stat().st_mode) == 0o644  # replaced by this user's
    assert evil not in snap.read_text()
