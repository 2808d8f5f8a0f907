"""One run of the runtime's child process (:mod:`.child`) for :mod:`.cache`, and what its
end means.

The child is told the maker's pid and dies with it (``PR_SET_PDEATHSIG``: a maker killed
while its child runs leaves no runtime running on). It imports the very ``ptestore``
package the maker runs (:func:`child_command`: loaded from this package's directory, not
looked up on the child's ``sys.path``, where ``PYTHONPATH``, the working directory or an
installed copy could put another one). Its failures become
:class:`~ptestore.errors.PackedWeightsRefused`, transient or not as :mod:`.refusal`
sorts them: its own refusal (exit 3, with its reason) and a crash by a signal the
runtime raises itself are deterministic, except a refusal or an abort that names an
allocation failure, or that does not happen again when the child runs once more; a timeout, a kill
from outside, a SIGBUS (a mapped file's page the kernel could not provide: a full disk)
and any other exit may pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import PackedWeightsRefused
from .refusal import DETERMINISTIC_SIGNALS, MAPPED_FILE, out_of_memory, signal_name

__all__ = ["PACKAGE", "ChildRun", "child_command"]

#: The directory of the ``ptestore`` package this process runs: the child's.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_BOOT = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "ptestore", {init!r}, submodule_search_locations=[{package!r}]
)
module = importlib.util.module_from_spec(spec)
sys.modules["ptestore"] = module
spec.loader.exec_module(module)
from ptestore.xnnpack.child import main
sys.exit(main(sys.argv[1:]))
"""


def child_command(req_path: Path) -> list[str]:
    """The child's command line on the request ``req_path``: this interpreter, with the
    ``ptestore`` package of this process (:data:`PACKAGE`) loaded from its directory
    before :mod:`.child` is imported, whatever the child's ``sys.path`` holds."""
    boot = _BOOT.format(init=os.path.join(PACKAGE, "__init__.py"), package=PACKAGE)
    return [sys.executable, "-c", boot, str(req_path)]


class ChildRun:
    """One run of :mod:`.child` in the work directory ``work`` and what it left."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work = work
        self.tag = tag
        self.stderr_path = work / f"{tag}.stderr"
        self.pass_fds: tuple[int, ...] = ()

    def run(
        self,
        req: dict[str, Any],
        artifact: str,
        what: str,
        timeout: float | None,
        made: tuple[Path, ...] = (),
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        """Run the child on ``req``; raises :class:`PackedWeightsRefused` when it fails.
        ``pass_fds``: descriptors the child inherits at the same numbers (the artifact
        held open, named ``/proc/self/fd/N`` in ``req``: :mod:`.pinned`).

        An abort (SIGABRT) whose messages name no allocation failure runs the child once
        more (``made``, the files it writes, removed first): only a second abort is
        deterministic (:mod:`.refusal`)."""
        self.pass_fds = pass_fds
        rc = self._once(req, artifact, what, timeout)
        if rc == -signal.SIGABRT and not out_of_memory(self.stderr()):
            for path in (*made, self.work / "error.json"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            rc = self._once(req, artifact, what, timeout)
            if rc == -signal.SIGABRT and not out_of_memory(self.stderr()):
                what += " (twice in a row)"
        if rc == 0:
            return
        reason = self.own_reason() if rc == 3 else None
        if reason is not None and out_of_memory(f"{reason}\n{self.stderr()}"):
            raise PackedWeightsRefused(  # its own refusal, of an allocation: may pass
                artifact,
                f"the runtime ran out of memory (exit 3) {what}: {reason}{self.tail()}",
                transient=True,
            )
        if reason is not None:
            raise PackedWeightsRefused(artifact, f"{what}: {reason}")
        if rc == -signal.SIGABRT and out_of_memory(self.stderr()):
            raise PackedWeightsRefused(
                artifact,
                f"the runtime ran out of memory ({signal_name(-rc)}, exit {128 - rc}) "
                f"{what}{self.tail()}",
                transient=True,
            )
        if rc < 0:
            if rc == -signal.SIGBUS:
                what += f" ({MAPPED_FILE})"
            raise PackedWeightsRefused(
                artifact,
                f"the ExecuTorch runtime crashed ({signal_name(-rc)}, exit {128 - rc}) "
                f"{what}{self.tail()}",
                transient=-rc not in DETERMINISTIC_SIGNALS,
            )
        raise PackedWeightsRefused(
            artifact, f"the runtime exited with {rc} {what}{self.tail()}", transient=True
        )

    def _once(self, req: dict[str, Any], artifact: str, what: str, timeout: float | None) -> int:
        """One run of the child; its exit status (negative: the signal that ended it)."""
        req_path = self.work / f"{self.tag}.json"
        req_path.write_text(json.dumps({**req, "parent": os.getpid()}), encoding="utf-8")
        env = dict(os.environ)
        env.setdefault("PYTHONWARNINGS", "ignore")
        with open(self.stderr_path, "wb") as err:
            try:
                done = subprocess.run(
                    child_command(req_path),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    timeout=timeout,
                    check=False,
                    pass_fds=self.pass_fds,
                )
            except subprocess.TimeoutExpired:
                raise PackedWeightsRefused(
                    artifact,
                    f"the runtime did not finish {what} within {timeout} s",
                    transient=True,
                ) from None
        return done.returncode

    def own_reason(self) -> str | None:
        """The reason the child wrote for its own refusal (exit 3), if it wrote one."""
        try:
            data = json.loads((self.work / "error.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        reason = data.get("reason") if isinstance(data, dict) else None
        return reason if isinstance(reason, str) else None

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self) -> str:
        lines = [ln for ln in self.stderr().splitlines() if ln.strip()][-5:]
        return ("; its last messages: " + " | ".join(lines)) if lines else ""
