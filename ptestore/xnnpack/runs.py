"""One run of the runtime's child process (:mod:`.child`) for :mod:`.cache`, and what its
end means.

The child is told the maker's pid and dies with it (``PR_SET_PDEATHSIG``: a maker killed
while its child runs leaves no runtime running on). Its failures become
:class:`~ptestore.errors.PackedWeightsRefused`, transient or not as :mod:`.refusal`
sorts them: its own refusal (exit 3, with its reason) and a crash by a signal the
runtime raises itself are deterministic; a timeout, a kill from outside and any other
exit may pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import PackedWeightsRefused
from .refusal import DETERMINISTIC_SIGNALS, signal_name

__all__ = ["ChildRun"]


class ChildRun:
    """One run of :mod:`.child` in the work directory ``work`` and what it left."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work = work
        self.tag = tag
        self.stderr_path = work / f"{tag}.stderr"

    def run(self, req: dict[str, Any], artifact: str, what: str, timeout: float | None) -> None:
        """Run the child on ``req``; raises :class:`PackedWeightsRefused` when it fails."""
        req_path = self.work / f"{self.tag}.json"
        req_path.write_text(json.dumps({**req, "parent": os.getpid()}), encoding="utf-8")
        env = dict(os.environ)
        env.setdefault("PYTHONWARNINGS", "ignore")
        with open(self.stderr_path, "wb") as err:
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "ptestore.xnnpack.child", str(req_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise PackedWeightsRefused(
                    artifact,
                    f"the runtime did not finish {what} within {timeout} s",
                    transient=True,
                ) from None
        rc = done.returncode
        if rc == 0:
            return
        reason = self.own_reason() if rc == 3 else None
        if reason is not None:
            raise PackedWeightsRefused(artifact, f"{what}: {reason}")
        if rc < 0:
            raise PackedWeightsRefused(
                artifact,
                f"the ExecuTorch runtime crashed ({signal_name(-rc)}, exit {128 - rc}) "
                f"{what}{self.tail()}",
                transient=-rc not in DETERMINISTIC_SIGNALS,
            )
        raise PackedWeightsRefused(
            artifact, f"the runtime exited with {rc} {what}{self.tail()}", transient=True
        )

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
