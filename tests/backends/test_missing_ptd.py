"""A ``.pte`` whose weights are in a ``.ptd`` that was not given: a backend (or a reader
outside a run) asking for one of those keys gets a ptestore error that names the key,
the file looked in and the missing ``.ptd``, never a bare ``KeyError``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.quiet_backend import Quiet

import ptestore
from ptestore.backends import BackendDataInitContext, BackendDataWriter
from ptestore.cli import main
from ptestore.errors import BackendError, MissingNamedData
from ptestore.testing.named_data import open_named_data

EXT = get_fixture("mlp_xnnpack_ext")


def _external_keys() -> list[str]:
    keys = [k["key"] for k in ptestore.describe(str(EXT.pte_path))["keys"]]
    assert keys, "the fixture's program refers to named data in its .ptd"
    return keys


def _message(key: str) -> str:
    return (
        f"named data key {key!r} is not in {EXT.pte_path}: no .ptd was given, and a key the "
        ".pte does not hold is in the model's .ptd (its external weights): pass it (CLI: "
        "--ptd SRC_PTD DST_PTD; Python: ptd=(src, dst))"
    )


class Reader(Quiet):
    """Reads the first weight the program refers to, as a packer would."""

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        super().initialize_backend_data(context, output)
        context.get_named_data_map().get_data(_external_keys()[0])


def test_a_backend_reading_a_weight_of_the_missing_ptd(tmp_path: Path) -> None:
    key = _external_keys()[0]
    with pytest.raises(BackendError) as info:
        ptestore.specialize(str(EXT.pte_path), str(tmp_path / "o.pte"), backends=[Reader()])
    assert f"initialize_backend_data failed: MissingNamedData: {_message(key)}" in str(info.value)
    assert not (tmp_path / "o.pte").exists()


@pytest.mark.parametrize(
    "call",
    ["get_data", "get_data_size", "read_into", "get_tensor_layout", "get_tensor_info",
     "get_array", "get_shared_keys", "read_chunks"],
)  # fmt: skip
def test_every_read_of_a_missing_key_names_it_and_the_file(call: str) -> None:
    key = _external_keys()[0]
    args: dict[str, tuple[object, ...]] = {"read_into": (bytearray(8),), "read_chunks": (4,)}
    named = open_named_data(str(EXT.pte_path))
    with named, pytest.raises(MissingNamedData) as info:
        getattr(named, call)(key, *args.get(call, ()))
    err = info.value
    assert str(err) == _message(key)
    assert isinstance(err, KeyError)  # the protocol's KeyError, still
    assert (err.key, err.files) == (key, (str(EXT.pte_path),))
    again = pickle.loads(pickle.dumps(err))  # crosses process pools intact
    assert (str(again), again.key, again.files) == (str(err), key, err.files)


def test_a_key_neither_file_holds() -> None:
    named = open_named_data(str(EXT.pte_path), str(EXT.ptd_path))
    with named, pytest.raises(MissingNamedData) as info:
        named.get_data("no-such-key")
    assert str(info.value) == (
        f"named data key 'no-such-key' is not in {EXT.pte_path} or {EXT.ptd_path}: "
        "neither file holds it"
    )


def test_the_cli_names_the_missing_ptd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ptestore.backends.register_backend(Reader, "reader")
    try:
        rc = main(["specialize", str(EXT.pte_path), str(tmp_path / "o.pte"), "--backend", "reader"])
    finally:
        ptestore.backends.unregister_backend("reader")
    err = capsys.readouterr().err
    assert rc != 0 and _message(_external_keys()[0]) in err


@pytest.mark.parametrize(
    ("name", "counts"),
    [("mlp_xnnpack", "holds 4 and reads none"), ("mlp_xnnpack_ext", "holds 0 and reads 4")],
)
def test_a_key_the_model_does_not_have_is_not_blamed_on_a_ptd(name: str, counts: str) -> None:
    """A mistyped key: the message sent the user looking for a .ptd that does not exist
    (mlp_xnnpack holds all its weights itself)."""
    pte = get_fixture(name).pte_path
    with pytest.raises(MissingNamedData) as info:
        open_named_data(str(pte)).get_data("no-such-key")
    assert str(info.value) == (
        f"named data key 'no-such-key' is not in {pte}: the model has no such key (the .pte "
        f"{counts} from a .ptd; ptestore inspect lists them)"
    )
