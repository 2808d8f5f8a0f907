"""ptestore's pytest plugin (``ptestore/testing/pytest_plugin.py``, issue 26 part 6), run
the way a vendor runs it: a project of one test file that imports only the kit it
subclasses, in a child pytest, with the plugin loaded by ``-p`` or by a ``pytest11``
entry point of a distribution in the child's own site directory (the line of this
repository's ``pyproject.toml``), and no conftest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PLUGIN = "ptestore.testing.pytest_plugin"

WRITER_TEST = """
import uuid
import weakref

import fsspec
import pytest

from ptestore.testing import WriterContract
from ptestore.writers import open_writer

class TestVendorMemoryWriter(WriterContract):
    model_examples = 3

    @pytest.fixture(autouse=True)
    def _made(self):
        self.made = weakref.WeakSet()

    def new_dest(self):
        return f"memory://vendor/{uuid.uuid4().hex}.pte"

    def make_writer(self, dest):
        w = open_writer(dest)
        self.made.add(w)
        return w

    def get(self, dest):
        fs = fsspec.filesystem("memory")
        path = dest[len("memory://"):]
        return fs.cat_file(path) if fs.exists(path) else None

    def put(self, dest, data):
        fsspec.filesystem("memory").pipe_file(dest[len("memory://"):], data)

    def leftovers(self, dest):
        return [w.url for w in self.made if w.url == dest and w.staged_size]
"""

BACKEND_TEST = """
from ptestore.backends.passthrough import PassthroughBackend
from ptestore.testing import BackendContract, shipped_program

class TestVendorBackend(BackendContract):
    declines_on_purpose = True  # the pass-through replaces nothing, by design

    def make_backend(self):
        return PassthroughBackend()

    def contract_programs(self):
        return [shipped_program("mlp_xnnpack")]
"""

REWRITTEN = """
import pytest

@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.s3
def test_the_kits_asserts_are_rewritten():
    import ptestore.testing.backend_contract as b
    import ptestore.testing.writer_contract as w
    import ptestore.testing.writer_races as r
    for module in (b, w, r):
        assert type(module.__loader__).__name__ == "AssertionRewritingHook", module

@pytest.mark.s3_xfail("moto", reason="stand-in")
def test_servers(s3_server):
    assert s3_server.name == "seaweedfs"
"""

STAND_INS = """
import pytest

class Fake:
    def __init__(self, name):
        self.name = name

@pytest.fixture(scope="session")
def moto_s3():
    return Fake("moto")

@pytest.fixture(scope="session")
def seaweedfs_s3():
    return Fake("seaweedfs")
"""


def _entry_point_line() -> str:
    """The ``[project.entry-points.pytest11]`` line of pyproject.toml, as an
    ``entry_points.txt`` line."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ((name, value),) = project["entry-points"]["pytest11"].items()
    return f"{name} = {value}"


def _site_with_entry_point(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    info = site / "vendor_probe-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\n{_entry_point_line()}\n")
    return site


def _vendor(
    tmp_path: Path, files: dict[str, str], *args: str, site: Path | None = None
) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "vendor"
    project.mkdir(exist_ok=True)
    ini = "[pytest]\naddopts = --strict-markers -p no:cacheprovider\n"
    (project / "pytest.ini").write_text(ini)
    for name, text in files.items():
        (project / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PTESTORE_REQUIRE_INTEROP"] = "0"
    paths = [str(ROOT)] + ([str(site)] if site is not None else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if site is None:
        # only what -p names: not the entry point of an installed ptestore, if any
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEsxX", *args, str(project)],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=600,
        check=False,
    )


def test_a_vendors_writer_test_runs_the_whole_contract(tmp_path: Path) -> None:
    done = _vendor(tmp_path, {"test_writer.py": WRITER_TEST}, "-p", PLUGIN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout


def test_a_vendors_backend_test_runs_the_contract(tmp_path: Path) -> None:
    """Every check but the runtime one (the suite runs that in test_backend_kit.py; in a
    child it would import torch and ExecuTorch again, about 25 s, for nothing new)."""
    done = _vendor(
        tmp_path,
        {"test_backend.py": BACKEND_TEST},
        "-p",
        PLUGIN,
        "--deselect",
        "test_backend.py::TestVendorBackend::test_loads_in_runtime[mlp_xnnpack-device]",
        "--deselect",
        "test_backend.py::TestVendorBackend::test_loads_in_runtime[mlp_xnnpack-no-device]",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the kit's checks over one program (keys, tensor info and compatibility on the runs
    # with and without a device, the recorded version, and that it specializes
    # something unless it declines on purpose)
    assert "11 passed, 2 deselected" in done.stdout, done.stdout


def test_markers_fixtures_and_rewriting_through_p(tmp_path: Path) -> None:
    files = {"conftest.py": STAND_INS, "test_kit.py": REWRITTEN}
    done = _vendor(tmp_path, files, "-p", PLUGIN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed, 1 xfailed" in done.stdout, done.stdout
    assert "XFAIL test_kit.py::test_servers[moto] - moto: stand-in" in done.stdout


@pytest.mark.parametrize("also_p", [False, True], ids=["entry-point", "entry-point-and-p"])
def test_the_entry_point_loads_it_once(tmp_path: Path, also_p: bool) -> None:
    """Installed (the entry point), no ``-p`` needed; given ``-p`` as well, it is the
    same plugin, not a second registration of the module (pytest refuses that)."""
    files = {"conftest.py": STAND_INS, "test_kit.py": REWRITTEN}
    args = ("-p", PLUGIN) if also_p else ()
    done = _vendor(tmp_path, files, *args, site=_site_with_entry_point(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed, 1 xfailed" in done.stdout, done.stdout


def test_disabled_it_provides_nothing(tmp_path: Path) -> None:
    files = {"test_kit.py": "def test_servers(s3_server):\n    pass\n"}
    site = _site_with_entry_point(tmp_path)
    done = _vendor(tmp_path, files, "-p", f"no:{PLUGIN}", site=site)
    assert done.returncode == 1, done.stdout
    assert "fixture 's3_server' not found" in done.stdout


def test_loading_it_imports_no_server_or_kit() -> None:
    code = (
        f"import sys, {PLUGIN}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ptestore', 'boto3', 'botocore', 'moto', 'hypothesis', 'numpy', 'fsspec')))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == str(
        sorted(["ptestore", "ptestore.errors", "ptestore.testing", PLUGIN])
    ), out
