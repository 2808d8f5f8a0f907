"""``support.slow_backend:Slow``: the fleet test backend that first sleeps for the
device option ``sleep`` seconds (a long compile, to interrupt a run mid-way)."""

from __future__ import annotations

import time

from support.fleet_backend import Scaler


class Slow(Scaler):
    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        device = context.device
        time.sleep(float(device.options.get("sleep", 0)) if device is not None else 0)
        super().initialize_backend_data(context, output)
