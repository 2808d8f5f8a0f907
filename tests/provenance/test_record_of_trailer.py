"""A record is read bound to its trailer (``Provenance.of_trailer``): one whose
``content.size`` is not where its trailer starts claims other bytes than precede it,
and nothing trusts it. ``read_provenance`` and ``inspect`` refuse it with the message
``verify`` gives; a run whose source carries one describes the source from its bytes
instead of taking its chunk digests (``provenance/known.py``). The fleet's paths (plan,
index, fetch, delta bases) are in ``tests/fleet/test_record_of_trailer.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.delta import program, version
from support.digests import tree
from support.fixtures import get_fixture
from support.forged import claiming, forge

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.provenance import read_provenance, read_trailer
from ptestore.provenance.known import forget, known_chunks
from ptestore.storage.loaders import BytesLoader, LocalFileLoader

MLP = get_fixture("mlp_xnnpack").pte_path
assert MLP is not None


@pytest.fixture(scope="module")
def specialized(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("bound") / "out.pte"
    ptestore.specialize(
        str(MLP), str(out), backends=["passthrough"], device=DeviceProfile("dev", {"a": 1})
    )
    return out.read_bytes()


def _message(data: bytes, extra: int) -> str:
    trailer = read_trailer(BytesLoader(data))
    assert trailer is not None
    real = trailer.content_size
    return (
        f"provenance content.size = {real + extra}: must be {real}, the bytes before the "
        "provenance trailer (its footer's content_size)"
    )


@pytest.mark.parametrize("extra", [1, -1])
def test_read_provenance_refuses_a_record_claiming_other_bytes(
    specialized: bytes, extra: int
) -> None:
    assert read_provenance(BytesLoader(specialized)) is not None
    with pytest.raises(FormatError) as err:
        read_provenance(BytesLoader(claiming(specialized, extra), "h.pte"))
    assert str(err.value) == f"h.pte: {_message(specialized, extra)}"


def test_inspect_shows_such_a_record_as_unreadable(
    specialized: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.pte"
    path.write_bytes(claiming(specialized))
    message = f"{path}: {_message(specialized, 1)}"
    capsys.readouterr()
    assert main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"] == {"error": message}
    assert main(["inspect", str(path)]) == 0
    assert f"provenance: unreadable: {message}" in capsys.readouterr().out


def test_a_source_whose_record_claims_other_bytes_is_described_from_its_bytes(
    tmp_path: Path,
) -> None:
    """The source's record names all-zero chunk digests for one byte more than its
    content: taken, they would become the output's digests of the chunks it copies.
    The run reads the source instead, and its output verifies."""
    src = version(program(tmp_path), tmp_path / "a" / "m.pte", "1")
    loader = LocalFileLoader(str(src))
    try:
        assert known_chunks(loader) is not None  # its own record, as made
    finally:
        loader.close()
    forge(src, 1, [bytes(32)])
    forget()
    loader = LocalFileLoader(str(src))
    try:
        assert known_chunks(loader) is None
    finally:
        loader.close()
    out = version(src, tmp_path / "b" / "m.pte", "2")
    prov = read_provenance(BytesLoader(out.read_bytes()))
    assert prov is not None and prov.source.sha256 == tree(src.read_bytes())
    report = ptestore.verify(str(out))
    assert report.status == "intact", report.message()
