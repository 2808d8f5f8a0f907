"""The public calls refuse an argument of the wrong type up front, each with a
``ConfigurationError`` naming the argument, the value and what it must be (``_args``):
a device given as its name, a ``ptd`` pair given as one string or of the wrong length,
a flag given as ``"no"`` (true), a tracer that cannot be called, a path given as None or
bytes to every call that opens one, a backend list given as one string to ``verify``.
Before, each was a bare ``TypeError``/``AttributeError`` from deep inside (blamed on a
backend, or after the backends ran), or worse, accepted: ``ptd="ab"`` read ``./a`` and
wrote ``./b``, ``provenance="no"`` wrote a trailer, ``verify(device={...})`` a verdict."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.coordinator import RunOptions
from ptestore.errors import ConfigurationError
from ptestore.storage.types import StorageURL

MLP = get_fixture("mlp_xnnpack")
PATHS = "must be a path or URL (a str or os.PathLike), got "


def _refused(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        call()
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"device": "pixel9"},
            "device must be a DeviceProfile or None, got str 'pixel9': pass "
            "DeviceProfile('pixel9')",
        ),
        (
            {"device": {"name": "x"}},
            "device must be a DeviceProfile or None, got dict {'name': 'x'}",
        ),
        (
            {"provenance": "no"},
            "provenance must be True, False or a ProvenanceRequest, got 'no'",
        ),
        ({"provenance": 0}, "provenance must be True, False or a ProvenanceRequest, got 0"),
        ({"in_place": "no"}, "in_place must be True or False, got 'no'"),
        ({"event_tracer": 3}, "event_tracer must be a callable or None, got int 3"),
        (
            {"ptd": "ab"},
            "ptd is a (src_ptd, dst_ptd) pair, got the str 'ab' alone: pass ptd=(SRC, DST)",
        ),
        (
            {"ptd": ("a.ptd",)},
            "ptd is a (src_ptd, dst_ptd) pair (a tuple of two paths or URLs), got 1 item: "
            "('a.ptd',)",
        ),
        (
            {"ptd": ("a.ptd", "b.ptd", "c.ptd")},
            "ptd is a (src_ptd, dst_ptd) pair (a tuple of two paths or URLs), got 3 items: "
            "('a.ptd', 'b.ptd', 'c.ptd')",
        ),
        (
            {"ptd": {"a.ptd": "b.ptd"}},
            "ptd is a (src_ptd, dst_ptd) pair (a tuple of two paths or URLs), got dict "
            "{'a.ptd': 'b.ptd'}",
        ),
        ({"ptd": ("a.ptd", None)}, f"ptd[1] {PATHS}None"),
        ({"ptd": (b"a.ptd", "b.ptd")}, f"ptd[0] {PATHS}bytes b'a.ptd'"),
    ],
)
def test_specialize_refuses_a_wrong_type_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    assert MLP.pte_path is not None
    monkeypatch.chdir(tmp_path)  # ptd="ab" read ./a and wrote ./b
    (tmp_path / "a").write_bytes(Path(MLP.pte_path).read_bytes())
    out = tmp_path / "out.pte"
    _refused(lambda: ptestore.specialize(MLP.pte_path, out, **kwargs), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # nothing written
    if "in_place" in kwargs:
        return
    if "ptd" in kwargs:  # the pair runner too (the fleet calls it directly)
        _refused(lambda: ptestore.specialize_pair(MLP.pte_path, out, **kwargs), message)
    else:  # and the pipeline's options, for whoever calls it with loaders
        _refused(lambda: RunOptions(**kwargs), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_device_name_in_place_is_refused_too(tmp_path: Path) -> None:
    assert MLP.pte_path is not None
    model = tmp_path / "m.pte"
    model.write_bytes(Path(MLP.pte_path).read_bytes())
    message = "device must be a DeviceProfile or None, got str 'phone': pass DeviceProfile('phone')"
    _refused(lambda: ptestore.specialize(model, model, in_place=True, device="phone"), message)  # type: ignore[arg-type]
    assert model.read_bytes() == Path(MLP.pte_path).read_bytes()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: StorageURL.of(b"m.pte"), f"url {PATHS}bytes b'm.pte'"),  # type: ignore[arg-type]
        (lambda: StorageURL.of(3, "src"), f"src {PATHS}int 3"),  # type: ignore[arg-type]
        (lambda: ptestore.describe(b"m.pte"), f"url {PATHS}bytes b'm.pte'"),  # type: ignore[arg-type]
        (lambda: ptestore.open_loader(b"m.pte"), f"url {PATHS}bytes b'm.pte'"),  # type: ignore[arg-type]
        (lambda: ptestore.open_writer(None), f"url {PATHS}None"),  # type: ignore[arg-type]
        (lambda: ptestore.recover(None), f"path {PATHS}None"),  # type: ignore[arg-type]
        (lambda: ptestore.fetch(None, "m.pte"), f"index_or_url {PATHS}None"),  # type: ignore[arg-type]
        (lambda: ptestore.fetch("i.json", b"m.pte"), f"dest {PATHS}bytes b'm.pte'"),  # type: ignore[arg-type]
        (lambda: ptestore.select(None, "m", "d"), f"index {PATHS}None"),  # type: ignore[arg-type]
        (lambda: ptestore.verify(None), f"url {PATHS}None"),  # type: ignore[arg-type]
    ],
)
def test_a_path_that_is_no_path_is_named(call: Callable[[], object], message: str) -> None:
    _refused(call, message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": 3}, f"source {PATHS}int 3"),
        ({"ptd": b"m.ptd"}, f"ptd {PATHS}bytes b'm.ptd'"),
        ({"ptd_source": 1.5}, f"ptd_source {PATHS}float 1.5"),
        (
            {"backends": "passthrough"},
            "backends must be a list of backend SPECs or objects, got the str 'passthrough' "
            "(iterated, it would be read an item at a time, each character a backend): pass "
            "backends=['passthrough']",
        ),
        (
            {"device": {"a": 1}},
            "device must be a DeviceProfile, a device's name or None, got dict {'a': 1}",
        ),
        ({"quick": "no"}, "quick must be True or False, got 'no'"),
        ({"as_planned": 1}, "as_planned must be True or False, got 1"),
        ({"xnnpack_cpu": 3}, "xnnpack_cpu must be a str or None, got int 3"),
    ],
)
def test_verify_refuses_a_wrong_type_rather_than_give_a_verdict(
    kwargs: dict[str, Any], message: str
) -> None:
    assert MLP.pte_path is not None
    _refused(lambda: ptestore.verify(MLP.pte_path, **kwargs), message)
