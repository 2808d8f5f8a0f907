"""``select`` as a device runs it on an index it did not write: nothing the index names
is imported or called (its SPECs are data), only backends installed here rate, the
worst rating wins, "no opinion" is not "optimal", and a device the job did not name
never gets another device's build unless its backends say it fits."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendInterface, register_backend, unregister_backend
from ptestore.backends.compat import Compatibility, DeviceProfile
from ptestore.cli import main
from ptestore.fleet.index import load_index
from ptestore.fleet.select import NO_OPINION, combine, select

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"


def _evil(marker: Path) -> str:
    """A SPEC that, if anything imported and called it, would create ``marker``."""
    code = f"open({str(marker)!r}, 'w').close()"
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    return f"os:system={cmd}"


@pytest.fixture(scope="module")
def fleet_index(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real ``fleet run``'s index (devices a and b), its entries' specs then replaced
    by a command an attacker would like devices to run."""
    tmp = tmp_path_factory.mktemp("fleet")
    job = tmp / "job.toml"
    job.write_text(
        f'destination = "{tmp}/out/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "m"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        '[devices.a]\nsoc = "x"\nscale = 2.0\n[devices.b]\nsoc = "y"\nscale = 3.0\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "--json", "--quiet"]) == 0
    return f"{tmp}/out/ptestore-index.json"


def _poison(index: str, marker: Path, tmp: Path) -> str:
    idx = load_index(index)
    for e in idx["entries"]:
        for stamp in e["compatibility"]:
            stamp["spec"] = _evil(marker)
    out = tmp / "poisoned" / "ptestore-index.json"
    out.parent.mkdir()
    out.write_text(json.dumps(idx))
    return str(out)


def test_an_index_never_runs_the_code_its_specs_name(
    fleet_index: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "PWNED"
    index = _poison(fleet_index, marker, tmp_path)
    # select, fetch INDEX and ensure INDEX, through the API and the CLI.
    choice = select(index, "m", "a")
    assert not marker.exists(), "select ran the command an index entry names"
    assert (choice.kind, choice.made_for, choice.rating) == ("artifact", "a", NO_OPINION)
    assert "no backend installed here serves 'XnnpackBackend' (no opinion)" in choice.reason
    assert main(["select", index, "--model", "m", "--device", "a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["made_for"] == "a"
    fetched = ptestore.fetch(index, tmp_path / "f" / "m.pte", model="m", device="a")
    assert fetched.choice is not None and fetched.choice.made_for == "a"
    assert main(["fetch", index, str(tmp_path / "g" / "m.pte"), "--model", "m",
                 "--device", "a"]) == 0  # fmt: skip
    made = ptestore.ensure(
        index,
        cache_dir=tmp_path / "cache",
        model="m",
        device=DeviceProfile("a", {"soc": "x", "scale": 2.0}),
    )
    assert made.choice is not None and made.choice["made_for"] == "a"
    opts = ["--device-option", "soc=x", "--device-option", "scale=2.0"]
    cache2 = str(tmp_path / "cache2")
    assert (
        main(["ensure", index, "--cache-dir", cache2, "--model", "m", "--device", "a", *opts]) == 0
    )
    capsys.readouterr()
    assert not marker.exists()
    # An import path is never resolved, even to a module this process has imported
    # (the fleet run above did): Scaler would rate a's build optimal for soc=x.
    assert "support.fleet_backend" in sys.modules
    idx = load_index(fleet_index)
    assert idx["entries"][0]["compatibility"][0]["spec"] == SPEC
    stranger = select(idx, "m", DeviceProfile("z", {"soc": "x", "scale": 2.0}))
    assert (stranger.kind, stranger.pte["url"]) == ("source", str(EXT.pte_path))


class _Soc(BackendInterface):
    """Rates by the device's ``soc`` (a backend installed on the device)."""

    name = "NpuBackend"
    version = "2.0"

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        soc = None if device is None else device.options.get("soc")
        if info != f"soc={soc}":
            return Compatibility.UNSUPPORTED
        return Compatibility.OPTIMAL if soc != "old" else Compatibility.PREFER_RESPECIALIZATION


class _Picky(BackendInterface):
    """A second backend of the same artifacts that only likes ``fast`` devices."""

    name = "DspBackend"
    version = "1.0"

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        fast = device is not None and device.options.get("fast") is True
        return Compatibility.OPTIMAL if fast else Compatibility.PREFER_RESPECIALIZATION


class _Silent(BackendInterface):
    """A backend with no compatibility check of its own (the default)."""

    name = "SilentBackend"


@pytest.fixture
def installed() -> Iterator[None]:
    for cls, name in ((_Soc, "npu"), (_Picky, "dsp"), (_Silent, "silent")):
        register_backend(cls, name)
    yield
    for name in ("npu", "dsp", "silent"):
        unregister_backend(name)


def _entry(device: str, options: dict[str, Any], *stamps: tuple[str, str]) -> dict[str, Any]:
    return {
        "model": "m",
        "device": device,
        "device_options": options,
        "device_digest": DeviceProfile(device, options).digest(),
        "source": {"url": "/src/m.pte", "size": 1, "sha256": "sha256:00"},
        "ptd_source": None,
        "pte": {"url": f"/out/{device}/m.pte", "size": 1, "sha256": "sha256:11"},
        "ptd": None,
        "compatibility": [
            {"id": i, "spec": "whatever:Nothing", "version": "1", "compatibility": c}
            for i, c in stamps
        ],
    }


def _index(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"format": "ptestore.index", "version": 2, "entries": list(entries)}


def test_the_worst_rating_wins_and_no_opinion_is_not_optimal() -> None:
    assert combine(["optimal", "prefer_respecialization"]) == "prefer_respecialization"
    assert combine(["optimal", NO_OPINION]) == NO_OPINION
    assert combine(["prefer_respecialization", NO_OPINION]) == NO_OPINION
    assert combine([NO_OPINION, "unsupported", "optimal"]) == "unsupported"
    assert combine(["optimal", "optimal"]) == "optimal"
    assert combine([]) == NO_OPINION
    with pytest.raises(ValueError, match="unknown rating 'best'"):
        combine(["best"])


def test_two_backends_that_disagree(installed: None) -> None:
    # Both backends made data of each artifact; _Soc rates p's optimal for soc=p, _Picky
    # only prefers a re-specialization on a device that is not fast: the worst wins.
    idx = _index(
        _entry("p", {"soc": "p"}, ("NpuBackend", "soc=p"), ("DspBackend", "")),
        _entry("q", {"soc": "q", "fast": True}, ("NpuBackend", "soc=q"), ("DspBackend", "")),
    )
    slow = select(idx, "m", DeviceProfile("new", {"soc": "p"}))
    assert (slow.kind, slow.made_for, slow.rating) == ("artifact", "p", "prefer_respecialization")
    assert "NpuBackend: installed 'npu' rates it optimal" in slow.reason
    assert "DspBackend: installed 'dsp' rates it prefer_respecialization" in slow.reason
    fast = select(idx, "m", DeviceProfile("new", {"soc": "p", "fast": True}))
    assert (fast.made_for, fast.rating) == ("p", "optimal")
    # _Picky is happy with q on a fast device, _Soc refuses it for soc=p: unsupported.
    cands = {c["made_for"]: c for c in fast.candidates}
    assert (cands["q"]["rating"], cands["q"]["eligible"]) == ("unsupported", False)
    # Nothing fits soc=r: the portable source, each refusal named.
    none = select(idx, "m", DeviceProfile("r", {"soc": "r", "fast": True}))
    assert (none.kind, none.pte["url"], none.rating) == ("source", "/src/m.pte", None)
    assert "p: NpuBackend: installed 'npu' rates it unsupported" in none.reason


def test_prefer_respecialization_ranks_below_optimal(installed: None) -> None:
    # The device's own artifact only prefers a re-specialization (soc "old" by _Soc's
    # rule); another device's build is optimal for it: optimal wins over the own name.
    mine = {"soc": "old", "fast": True}
    idx = _index(
        _entry("mine", mine, ("NpuBackend", "soc=old"), ("DspBackend", "")),
        _entry("other", {"soc": "x"}, ("DspBackend", "")),
    )
    got = select(idx, "m", DeviceProfile("mine", mine))
    assert (got.made_for, got.rating) == ("other", "optimal")
    assert [c["rating"] for c in got.candidates] == ["prefer_respecialization", "optimal"]
    # Without the optimal one, the own build that prefers a re-specialization is used.
    alone = select(_index(idx["entries"][0]), "m", "mine")
    assert (alone.kind, alone.made_for, alone.rating) == (
        "artifact",
        "mine",
        "prefer_respecialization",
    )


def test_an_unknown_device_never_gets_a_build_nobody_vouches_for(installed: None) -> None:
    # The only backend of these artifacts has no compatibility check: no opinion.
    idx = _index(
        _entry("a", {"soc": "x"}, ("SilentBackend", "")),
        _entry("b", {"soc": "y"}, ("SilentBackend", "")),
    )
    own = select(idx, "m", "a")  # its own build, made for exactly this profile
    assert (own.kind, own.made_for, own.rating) == ("artifact", "a", NO_OPINION)
    assert "SilentBackend: installed 'silent' has no compatibility check (no opinion)" in (
        own.reason
    )
    stranger = select(idx, "m", "zz")  # a device the job did not name
    assert (stranger.kind, stranger.pte["url"]) == ("source", "/src/m.pte")
    assert "made for another device, and not every backend installed here rates it" in (
        stranger.reason
    )
    # The same name with other options is not the device the artifact was made for.
    other = select(idx, "m", DeviceProfile("a", {"soc": "q"}))
    assert other.kind == "source"
    # An id no backend installed here serves: no opinion too, never "optimal".
    idx2 = _index(_entry("a", {"soc": "x"}, ("VendorBackend", "")))
    assert select(idx2, "m", "a").rating == NO_OPINION
    assert select(idx2, "m", "zz").kind == "source"
    # A generic artifact (no backend made any of its data) fits every device.
    gen = select(_index(_entry("a", {"soc": "x"})), "m", "zz")
    assert (gen.kind, gen.made_for, gen.rating) == ("artifact", "a", NO_OPINION)
    assert "no backend made any of its data (generic)" in gen.reason


def test_a_spec_naming_an_installed_backend_picks_it_by_name(installed: None) -> None:
    # The index's spec "npu=ARG" names an installed registration: it is used, without
    # the index's ARGUMENT; a spec naming something not installed falls back to the id.
    e = _entry("a", {"soc": "x"}, ("NpuBackend", "soc=x"))
    e["compatibility"][0]["spec"] = "npu@NpuBackend=--evil"
    got = select(_index(e), "m", DeviceProfile("b", {"soc": "x"}))
    assert (got.kind, got.rating) == ("artifact", "optimal")
    assert "installed 'npu'" in got.reason
    # An installed name that serves another id does not rate this id's data: the
    # backend installed for the id does.
    e["compatibility"][0]["spec"] = "dsp"
    got = select(_index(e), "m", DeviceProfile("b", {"soc": "x"}))
    assert "NpuBackend: installed 'npu' rates it optimal" in got.reason


def test_a_device_given_by_name_is_the_device_of_its_entry(installed: None) -> None:
    # An index that records only the options' digest: the name alone says which build
    # is the device's own (a profile with options must match the digest).
    e = _entry("a", {"soc": "x"}, ("SilentBackend", ""))
    e["device_options"] = None
    assert select(_index(e), "m", "a").made_for == "a"
    assert select(_index(e), "m", DeviceProfile("a", {"soc": "x"})).made_for == "a"
    assert select(_index(e), "m", DeviceProfile("a", {"soc": "y"})).kind == "source"


def test_a_hostile_spec_is_rated_by_the_backend_installed_for_its_id(
    installed: None, tmp_path: Path
) -> None:
    marker = tmp_path / "PWNED"
    e = _entry("a", {"soc": "x"}, ("NpuBackend", "soc=x"))
    e["compatibility"][0]["spec"] = _evil(marker)
    path = tmp_path / "ptestore-index.json"
    path.write_text(json.dumps(_index(e)))
    got = select(str(path), "m", DeviceProfile("b", {"soc": "x"}))
    assert (got.kind, got.made_for, got.rating) == ("artifact", "a", "optimal")
    assert "NpuBackend: installed 'npu' rates it optimal" in got.reason
    assert not marker.exists()


def test_a_name_asked_for_that_is_not_utf8_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command-line argument of bytes that are not UTF-8 arrives as lone surrogates:
    hashing it to find its shard raised a bare UnicodeEncodeError (a traceback, exit 1)
    from select, fetch and ensure INDEX."""
    from ptestore.errors import ConfigurationError
    from ptestore.fleet.index import find_entry

    mlp = get_fixture("mlp_xnnpack").pte_path
    assert mlp is not None
    (tmp_path / "m.pte").write_bytes(mlp.read_bytes())
    job = tmp_path / "job.toml"
    job.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        f'[[models]]\nname = "m"\nsource = "{tmp_path}/m.pte"\n[devices.a]\n'
    )
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    index = str(tmp_path / "out" / "ptestore-index.json")
    capsys.readouterr()
    message = (
        "{what} '\\udcff': not valid UTF-8 text (character '\\udcff' at index 0): an index "
        "names models and devices in UTF-8"
    )
    for what, model, device in (("model", "\udcff", "a"), ("device", "m", "\udcff")):
        assert main(["select", index, "--model", model, "--device", device]) == 2
        err = capsys.readouterr().err
        assert err == f"ptestore select: error: {message.format(what=what)}\n"
        dest = str(tmp_path / "f.pte")
        assert main(["fetch", index, dest, "--model", model, "--device", device]) == 2
        assert message.format(what=what) in capsys.readouterr().err
        with pytest.raises(ConfigurationError, match="not valid UTF-8 text"):
            find_entry(index, model, device)
    assert not (tmp_path / "f.pte").exists()
