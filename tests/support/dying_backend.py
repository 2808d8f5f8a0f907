"""A backend whose worker process dies, for the process-pool tests: importable by spawned
workers as ``support.dying_backend:Dying``. Its behaviour is chosen by device options,
synchronized by files (never by time):

- ``die_when = PATH``: wait until PATH exists, then ``os._exit(3)`` (every time);
- ``first_blocks = PATH``: the first time (PATH absent) create PATH and wait for a file
  that never appears (the broken pool terminates the process); later runs go on;
- ``fail = true``: raise (the pair fails, its writers discard);
- otherwise: replace the first named key with its bytes reversed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ptestore.backends import BackendData, BackendInterface


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)  # polls a file written by another process: no deadline


class Dying(BackendInterface):
    name = "XnnpackBackend"
    version = "1"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        options = context.device.options if context.device is not None else {}
        if options.get("fail"):
            raise RuntimeError("the backend failed on purpose")
        if "die_when" in options:
            _wait_for(options["die_when"])
            os._exit(3)
        marker = options.get("first_blocks")
        if marker and not os.path.exists(marker):
            with open(marker, "w"):
                pass
            _wait_for(marker + ".never")
        named = context.get_named_data_map()
        keys = list(named)
        if keys:
            raw = bytes(named.get_data(keys[0]))
            output.write_named_data(keys[0], BackendData(raw[::-1]))

    def compatibility_info(self, context: Any) -> str:
        return "dying"
