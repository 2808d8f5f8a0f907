"""A backend for the crash tests: replaces every named key with its bytes reversed (same
size), so that the specialized output differs from its source."""

from __future__ import annotations

from typing import Any

from ptestore.backends import BackendData, BackendInterface


class Reverse(BackendInterface):
    name = "*"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        named = context.get_named_data_map()
        keys = named.keys()
        for key in keys:
            output.write_named_data(key, BackendData(bytes(reversed(bytes(named.get_data(key))))))
