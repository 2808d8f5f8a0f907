"""``support.slow_backend:Slow``: the fleet test backend that first sleeps for the
device option ``sleep`` seconds (a long compile, to interrupt a run mid-way). With the
device option ``started`` (a path) it first creates that file, so that a test waits for
the backend to have started rather than for a guessed time."""

from __future__ import annotations

import time
from pathlib import Path

from support.fleet_backend import Scaler


class Slow(Scaler):
    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        device = context.device
        options = device.options if device is not None else {}
        if options.get("started"):
            Path(options["started"]).touch()
        time.sleep(float(options.get("sleep", 0)))
        super().initialize_backend_data(context, output)
