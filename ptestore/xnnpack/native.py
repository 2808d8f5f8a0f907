"""The native piece: ``shim.cpp`` built against the installed executorch wheel's headers.

The wheel's Python bindings load every method without a ``LoadBackendOptionsMap``, the
only way XNNPACK's packed-weight cache is switched on in 1.4.1. ``shim.cpp`` (package
data, ptestore's own code) defines ``Program::load_method`` with the header's signature
and adds the XNNPACK options; loaded ``RTLD_GLOBAL`` before the bindings' extension, it
is the definition the extension's calls bind to (they go through its PLT).

It is built with the C++ compiler (``$CXX``, else ``g++``) on first use, or by
``python -m ptestore.xnnpack build``, into the user cache directory
(``$XDG_CACHE_HOME/ptestore/xnnpack``, else ``~/.cache/ptestore/xnnpack``) under a name
made of the wheel's exact version, its git revision and a hash of the source and flags:
another wheel or another source builds another library. The build is atomic (a temp
name, then rename) under an ``flock``, so concurrent first uses build it once.

Nothing here imports executorch when imported: the wheel is found with
``importlib.util.find_spec``. :func:`bindings` imports the runtime when asked.
"""

from __future__ import annotations

import ast
import fcntl
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from .._dataclass import dataclass
from ..errors import ConfigurationError

__all__ = [
    "ExecutorchBuild",
    "Shim",
    "bindings",
    "build_shim",
    "executorch_build",
    "shim_source",
]

SHIM_NAME = "libptestore_xnnpack_shim.so"
#: Flags of the build (part of the cache name: other flags, another library).
CXXFLAGS = (
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    # the wheel ships no generated cmake_macros.h; logging symbols are hidden in it
    "-DC10_USING_CUSTOM_GENERATED_MACROS",
    "-DET_LOG_ENABLED=0",
    "-Wl,--no-undefined",
)
_PROGRAM_H = "include/executorch/runtime/executor/program.h"
_OPTIONS_MAP_H = "include/executorch/runtime/backend/backend_options_map.h"


@dataclass(frozen=True)
class ExecutorchBuild:
    """The installed ExecuTorch runtime: where it is and which build it is."""

    root: Path
    version: str
    git_version: str
    #: The bindings' extension (``_portable_lib*.so``) that holds the runtime.
    runtime_library: Path

    def to_json(self) -> dict[str, str]:
        return {"version": self.version, "git_version": self.git_version}


@dataclass(frozen=True)
class Shim:
    """The built native piece and the runtime it was built for."""

    path: Path
    build: ExecutorchBuild


def executorch_build() -> ExecutorchBuild:
    """The installed executorch wheel (not imported); :class:`ConfigurationError` when
    there is none or it lacks what the native piece needs."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "ptestore.xnnpack needs the ExecuTorch runtime: no 'executorch' module is "
            "installed (pip install 'ptestore[xnnpack]')"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    version_py = root / "version.py"
    try:
        tree = ast.parse(version_py.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        raise ConfigurationError(
            f"{version_py}: cannot read the executorch build's version ({exc})"
        ) from None
    values: dict[str, object] = {}
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id in ("__version__", "git_version"):
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                values[target.id] = None
    version, git = values.get("__version__"), values.get("git_version")
    if not isinstance(version, str) or not isinstance(git, str) or not git:
        raise ConfigurationError(
            f"{version_py}: __version__ and git_version must both be strings "
            f"(found {version!r} and {git!r}); the packed-weight file is bound to both"
        )
    libs = sorted(glob.glob(str(root / "extension" / "pybindings" / "_portable_lib*.so")))
    if len(libs) != 1:
        raise ConfigurationError(
            f"{root / 'extension' / 'pybindings'}: expected one _portable_lib*.so "
            f"(the runtime of the Python bindings), found {len(libs)}"
        )
    return ExecutorchBuild(root, version, git, Path(libs[0]))


def bindings() -> Any:
    """The Python bindings' extension (``executorch.extension.pybindings._portable_lib``),
    after :mod:`torch` (its libraries and tensor types come with it).

    Not through ``portable_lib``, the wrapper that re-exports the same names: it imports
    ``executorch.exir`` (the exporter, and torch's compiler with it) for one warning
    class. Measured on the 1.4.1 wheel, a fresh process is ready to load a program in
    3.2 s this way and in 12.0 s through the wrapper: the difference is paid by every
    child that makes or checks a packed-weight file."""
    import torch  # noqa: F401  (before the extension: it resolves libtorch's symbols)
    from executorch.extension.pybindings import (  # type: ignore[import-untyped]
        _portable_lib,
    )

    return _portable_lib


def shim_source() -> bytes:
    """The C++ source of the native piece (package data)."""
    return resources.files(__package__).joinpath("shim.cpp").read_bytes()


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ptestore" / "xnnpack"


def _compiler() -> str:
    name = os.environ.get("CXX") or "g++"
    found = shutil.which(name)
    if found is None:
        raise ConfigurationError(
            f"ptestore.xnnpack builds a small native piece on first use and needs a C++17 "
            f"compiler: {name!r} is not on PATH (install g++, e.g. `apt-get install g++`, "
            f"or set CXX to one)"
        )
    return found


def build_shim(*, force: bool = False) -> Shim:
    """The native piece for the installed runtime, built now unless the cache has it.

    Raises :class:`ConfigurationError` naming what to install when the compiler or the
    wheel's headers are missing, or with the compiler's message when the build fails."""
    build = executorch_build()
    for header in (_PROGRAM_H, _OPTIONS_MAP_H):
        if not (build.root / header).is_file():
            raise ConfigurationError(
                f"{build.root / header}: missing; ptestore.xnnpack builds against the "
                f"headers the executorch wheel ships (install executorch=={build.version} "
                f"from PyPI, whose wheel has include/executorch)"
            )
    source = shim_source()
    digest = hashlib.sha256(source + "\0".join(CXXFLAGS).encode()).hexdigest()[:16]
    safe_version = "".join(c if c.isalnum() or c in ".-_" else "_" for c in build.version)
    directory = _cache_root() / f"{safe_version}-{build.git_version[:12]}-{digest}"
    target = directory / SHIM_NAME
    if target.is_file() and not force:
        return Shim(target, build)
    compiler = _compiler()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if target.is_file() and not force:
            return Shim(target, build)
        src = directory / "shim.cpp"
        src.write_bytes(source)
        tmp = directory / f".{SHIM_NAME}.{os.getpid()}.tmp"
        include = build.root / "include"
        cmd = [
            compiler,
            *CXXFLAGS,
            f"-I{include}",
            f"-I{include / 'executorch/runtime/core/portable_type/c10'}",
            str(src),
            "-o",
            str(tmp),
            "-ldl",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise ConfigurationError(f"{compiler}: cannot run the C++ compiler ({exc})") from None
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise ConfigurationError(
                f"building ptestore's XNNPACK shim against executorch {build.version} "
                f"({build.root / 'include'}) failed (exit {done.returncode}):\n{tail}"
            )
        # Published durably: a shim truncated by a crash would be found and fail to load.
        from ..storage.atomic import rename_synced

        rename_synced(str(tmp), str(target))
    return Shim(target, build)
