"""``support.hanging_backend:Hanging``: the fleet test backend (:class:`Scaler`) whose
pair may never end, for ``fleet run --pair-timeout``; importable by spawned pool workers.
Its behaviour is chosen by device options, synchronized by files (never by time):

- ``started = PATH``: create PATH on entry;
- ``after = PATH``: then wait until PATH exists (polled, no deadline);
- ``sleep = SECONDS``: then sleep that long (a pair that starts later than another);
- ``hang = "soft"``: then wait forever in Python (SIGTERM reaches it: ``Terminated``);
- ``hang = "hard"``: the same with SIGTERM blocked, as in a call into native code that
  never returns to Python: only SIGKILL ends it;
- ``first_hangs = PATH``: the first time (PATH absent) create PATH and wait forever (a
  broken pool stops it); later runs go on;
- otherwise: scale the weights as :class:`Scaler` does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from support.fleet_backend import Scaler


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)  # a file another process writes: no deadline


class Hanging(Scaler):
    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        device = context.device
        options = device.options if device is not None else {}
        if options.get("started"):
            Path(options["started"]).touch()
        if options.get("after"):
            _wait_for(options["after"])
        time.sleep(float(options.get("sleep", 0)))
        if options.get("hang") == "hard":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        marker = options.get("first_hangs")
        first = marker is not None and not os.path.exists(marker)
        if first:
            Path(marker).touch()
        if options.get("hang") or first:
            while True:
                threading.Event().wait(3600)
        super().initialize_backend_data(context, output)
