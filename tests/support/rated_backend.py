"""Backends whose rating of what they made depends on the SDK installed now (the
environment variable ``PTESTORE_TEST_SDK``, default ``2.30``), at one ``version``: an
SDK update makes the artifacts they made ``prefer_respecialization``, which ``verify
--job`` and a fleet plan both see (``tests/fleet/test_plan_rating.py``). Importable by
worker processes as ``support.rated_backend:SdkRated``.

``SdkRated`` stamps the SDK it made an artifact with (``sdk=2.30``) and rates a stamp of
another SDK ``PREFER_RESPECIALIZATION``; ``Stuck`` stamps an SDK it can never make again
(``sdk=old``): what it makes is below optimal at once, so every plan runs it again.
"""

from __future__ import annotations

import os
from typing import Any

from ptestore.backends import BackendData, BackendInterface, Compatibility, DeviceProfile


def installed_sdk() -> str:
    return os.environ.get("PTESTORE_TEST_SDK", "2.30")


class SdkRated(BackendInterface):
    """Replaces the first named value by itself reversed (deterministic)."""

    name = "XnnpackBackend"
    version = "1.0"  # the SDK is not part of the version: only the rating sees it

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))

    def compatibility_info(self, context: Any) -> str:
        return f"sdk={installed_sdk()}"

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        fields = dict(kv.split("=", 1) for kv in info.split(";") if "=" in kv)
        if fields.get("sdk") != installed_sdk():
            return Compatibility.PREFER_RESPECIALIZATION
        return Compatibility.OPTIMAL


class Stuck(SdkRated):
    def compatibility_info(self, context: Any) -> str:
        return "sdk=old"
