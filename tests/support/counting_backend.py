"""A real backend (the fleet ``Scaler``: weights times the device's ``scale``) that also
records every call, for the ``ensure`` tests: each ``initialize_backend_data`` appends its
process id to the file named by ``PTESTORE_TEST_CALLS`` and then, with
``PTESTORE_TEST_HOLD=SECONDS``, waits that long (so that racing processes overlap and a
test can kill the one holding the lock). SPEC ``support.counting_backend:Counting=VERSION``.

:class:`Recorder` counts its calls in the process instead (for tests that check no
backend ran: a source refused when it is read).
"""

from __future__ import annotations

import os
import time

from ptestore.backends import BackendDataInitContext, BackendDataWriter, BackendInterface
from support.fleet_backend import Scaler


class Counting(Scaler):
    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        calls = os.environ.get("PTESTORE_TEST_CALLS")
        if calls:
            with open(calls, "a") as f:
                f.write(f"{os.getpid()}\n")
        hold = float(os.environ.get("PTESTORE_TEST_HOLD", "0") or 0)
        if hold:
            time.sleep(hold)
        super().initialize_backend_data(context, output)


class Recorder(BackendInterface):
    """Serves XnnpackBackend and counts its calls."""

    name = "XnnpackBackend"

    def __init__(self) -> None:
        self.calls = 0

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        self.calls += 1
