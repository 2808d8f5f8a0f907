"""``select`` for a device of a name an index knows, given with other options: the
reason says it is another profile of that name and which options differ (it said "made
for another device", which sent readers looking for a device name they had right)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ptestore.backends import BackendInterface, register_backend, unregister_backend
from ptestore.backends.compat import DeviceProfile
from ptestore.fleet.select import select

#: The job of docs/fleet.md: pixel9 with a SoC and compiler flags.
PIXEL9 = {"soc": "sm8650", "flags": ["-O3", "--htp-v75"]}


class _Silent(BackendInterface):
    """A backend with no compatibility check (no opinion: another profile's build is
    not used)."""

    name = "SilentBackend"


@pytest.fixture
def installed() -> Iterator[None]:
    register_backend(_Silent, "silent")
    yield
    unregister_backend("silent")


def _index(options: dict[str, Any] | None, digest_of: dict[str, Any]) -> dict[str, Any]:
    entry = {
        "model": "mlp",
        "device": "pixel9",
        "device_options": options,
        "device_digest": DeviceProfile("pixel9", digest_of).digest(),
        "source": {"url": "/src/mlp.pte", "size": 1, "sha256": "sha256:00"},
        "ptd_source": None,
        "pte": {"url": "/out/pixel9/mlp.pte", "size": 1, "sha256": "sha256:11"},
        "ptd": None,
        "compatibility": [
            {"id": "SilentBackend", "spec": "x:Y", "version": "1", "compatibility": ""}
        ],
    }
    return {"format": "ptestore.index", "version": 2, "entries": [entry]}


def test_the_same_name_with_other_options_is_said_to_be_another_profile(
    installed: None,
) -> None:
    idx = _index(PIXEL9, PIXEL9)
    # A name alone takes the options the index records for it: the device's own build.
    own = select(idx, "mlp", "pixel9")
    assert (own.kind, own.made_for) == ("artifact", "pixel9")
    # Only the SoC, as docs/device.md's example gave it: another profile of pixel9.
    soc_only = select(idx, "mlp", DeviceProfile("pixel9", {"soc": "sm8650"}))
    assert soc_only.kind == "source"
    (cand,) = soc_only.candidates
    assert cand["reason"] == (
        "SilentBackend: installed 'silent' has no compatibility check (no opinion): made "
        "for another profile of 'pixel9', and not every backend installed here rates it "
        "for this one (from the index's options to this device's: flags removed (was "
        "['-O3', '--htp-v75']); options given must be the index's exactly, a name alone "
        "takes them)"
    )
    assert "made for another profile of 'pixel9', and not every backend" in soc_only.reason
    assert "another device" not in soc_only.reason
    # An entry that records only the digest of its options: said so.
    bare = select(_index(None, PIXEL9), "mlp", DeviceProfile("pixel9", {"soc": "sm8650"}))
    assert bare.kind == "source"
    assert bare.candidates[0]["reason"].endswith(
        "for this one (its options' digest is not this device's; options given must be "
        "the index's exactly, a name alone takes them)"
    )
    # Another name is still another device.
    other = select(idx, "mlp", DeviceProfile("galaxy", {"soc": "sm8650"}))
    assert "made for another device, and not every backend installed here" in other.reason
