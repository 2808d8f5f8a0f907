"""A real backend that doubles one fixture's keyed float32 weight (the fixture's
"doubled" expectation gives the runtime outputs), importable by SPEC from any process:
``support.doubling_backend:Doubling=FIXTURE`` (for example ``=mlp_xnnpack``). Every call
appends its process id to the file named by ``PTESTORE_TEST_CALLS``, when set.
"""

from __future__ import annotations

import os
from typing import Any

from ptestore.backends import BackendData, BackendInterface
from support.fixtures import get_fixture


class Doubling(BackendInterface):
    version = "1.0"

    def __init__(self, fixture: str) -> None:
        fx = get_fixture(fixture)
        assert fx.doubled is not None and fx.doubled.key is not None
        self.doubled = fx.doubled
        self.name = str(fx.facts["pte"]["delegates"][0]["id"])

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        calls = os.environ.get("PTESTORE_TEST_CALLS")
        if calls:
            with open(calls, "a") as f:
                f.write(f"{os.getpid()}\n")
        key = self.doubled.key
        value = bytes(context.get_named_data_map().get_data(key))
        output.write_named_data(key, BackendData(self.doubled.doubled_value(value)))
