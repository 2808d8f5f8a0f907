"""A ``DeviceProfile``'s options are deeply read-only: a backend is given the caller's own
profile (``context.device``), and one that did ``context.device.options.setdefault(
'threads', 4)`` changed it (its digest and hash): the provenance then recorded options
the caller never gave, and a fleet pair failed on every run ("after publishing, the
destination is not current"). Now any change raises a ``TypeError`` saying why, and the
options still compare, serialize (JSON) and pickle as the plain values they were."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import ptestore
from ptestore.backends import BackendData, BackendInterface, DeviceProfile
from ptestore.errors import BackendError
from ptestore.provenance import read_provenance
from ptestore.storage.loaders import open_loader

OPTIONS = {"soc": "sm8650", "tuning": {"tiles": [1, {"n": 2}]}}

READ_ONLY = (
    "device options are read-only: {what} would change the profile, whose digest is "
    "recorded with what it made; make a new DeviceProfile(name, {{**profile.options, ...}}) "
    "or change a copy (copy.deepcopy(profile.options) is a plain dict)"
)


class SetsDefaults(BackendInterface):
    """Fills in an option the caller did not give (the reviewer's backend)."""

    name = "XnnpackBackend"
    version = "1"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        context.device.options.setdefault("threads", 4)
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))


class AppendsTile(SetsDefaults):
    def initialize_backend_data(self, context: Any, output: Any) -> None:
        context.device.options["tuning"]["tiles"].append(8)


def test_a_backend_cannot_change_the_callers_profile(src: Path, tmp_path: Path) -> None:
    device = DeviceProfile("phone", OPTIONS)
    digest, hashed = device.digest(), hash(device)
    for backend, what in (
        (SetsDefaults(), "setdefault('threads', ...)"),
        (AppendsTile(), "append(8)"),
    ):
        with pytest.raises(BackendError) as err:
            ptestore.specialize(src, tmp_path / "o.pte", backends=[backend], device=device)
        assert str(err.value).endswith(
            "initialize_backend_data failed: TypeError: " + READ_ONLY.format(what=what)
        ), str(err.value)
        assert (device.digest(), hash(device)) == (digest, hashed)
        assert device.options == OPTIONS
        assert not (tmp_path / "o.pte").exists()


def test_the_recorded_options_are_the_callers(src: Path, tmp_path: Path) -> None:
    class Reads(SetsDefaults):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            opts = copy.deepcopy(context.device.options)  # a plain copy may change
            opts.setdefault("threads", 4)
            assert opts["threads"] == 4 and "threads" not in context.device.options
            named = context.get_named_data_map()
            key = sorted(named)[0]
            output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))

    device = DeviceProfile("phone", OPTIONS)
    out = tmp_path / "o.pte"
    ptestore.specialize(src, out, backends=[Reads()], device=device)
    loader = open_loader(str(out))
    try:
        record = read_provenance(loader)
    finally:
        loader.close()
    assert record is not None and record.device is not None
    assert record.device.options == OPTIONS
    assert record.device.digest == device.digest() == DeviceProfile("phone", OPTIONS).digest()


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda o: o.__setitem__("soc", "x"), "['soc'] = ..."),
        (lambda o: o.__delitem__("soc"), "del ['soc']"),
        (lambda o: o.update(soc="x"), "update(...)"),
        (lambda o: o.pop("soc"), "pop('soc')"),
        (lambda o: o.popitem(), "popitem()"),
        (lambda o: o.clear(), "clear()"),
        (lambda o: o.__ior__({"a": 1}), "|="),
        (lambda o: o["tuning"].__setitem__("x", 1), "['x'] = ..."),
        (lambda o: o["tuning"]["tiles"].__setitem__(0, 5), "[0] = ..."),
        (lambda o: o["tuning"]["tiles"].extend([5]), "extend(...)"),
        (lambda o: o["tuning"]["tiles"].insert(0, 5), "insert(0, ...)"),
        (lambda o: o["tuning"]["tiles"].remove(1), "remove(1)"),
        (lambda o: o["tuning"]["tiles"].pop(), "pop()"),
        (lambda o: o["tuning"]["tiles"].sort(), "sort()"),
        (lambda o: o["tuning"]["tiles"].reverse(), "reverse()"),
        (lambda o: o["tuning"]["tiles"].__iadd__([5]), "+="),
        (lambda o: o["tuning"]["tiles"][1].setdefault("m", 3), "setdefault('m', ...)"),
    ],
)
def test_every_change_is_refused_saying_why(change: Any, what: str) -> None:
    device = DeviceProfile("phone", OPTIONS)
    with pytest.raises(TypeError) as err:
        change(device.options)
    assert str(err.value) == READ_ONLY.format(what=what)
    assert device.options == OPTIONS


def test_the_options_still_behave_as_plain_values() -> None:
    given = copy.deepcopy(OPTIONS)
    device = DeviceProfile("phone", given)
    given["soc"] = "changed"  # copied: the caller's dict is not the profile's
    assert device.options == OPTIONS and device == DeviceProfile("phone", OPTIONS)
    assert hash(device) == hash(DeviceProfile("phone", OPTIONS))
    assert isinstance(device.options, dict) and isinstance(device.options["tuning"]["tiles"], list)
    assert json.loads(json.dumps(device.options)) == OPTIONS
    assert device.environment()["PTESTORE_DEVICE_OPTIONS"] == json.dumps(
        OPTIONS, sort_keys=True, separators=(",", ":")
    )
    assert device.to_dict()["options"] == OPTIONS
    device.to_dict()["options"]["soc"] = "x"  # a plain copy
    again = pickle.loads(pickle.dumps(device))  # as a Dask worker gets a task
    assert again == device and again.digest() == device.digest()
    with pytest.raises(TypeError, match="device options are read-only"):
        again.options["tuning"]["tiles"].append(1)
    thawed = copy.deepcopy(device.options)
    thawed["tuning"]["tiles"].append(3)  # a plain, mutable deep copy
    assert type(thawed) is dict and device.options == OPTIONS
    shallow = copy.copy(device.options)
    shallow["soc"] = "x"
    assert type(shallow) is dict and device.options["soc"] == "sm8650"
    assert copy.deepcopy(device) is device and copy.copy(device) is device
