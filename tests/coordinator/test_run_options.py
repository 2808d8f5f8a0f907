"""``RunOptions``: the keyword arguments of ``initialize_and_save_backend_data`` as one
record, checked when made; the keyword arguments keep working as they always did."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.coordinator import Event, RunOptions, initialize_and_save_backend_data
from ptestore.errors import AlreadyExists, ConfigurationError
from ptestore.storage.loaders import open_loader
from ptestore.writers import open_writer

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")


def test_defaults_are_the_keyword_defaults() -> None:
    o = RunOptions()
    assert (o.backends, o.event_tracer, o.mode, o.spool_dir, o.strict, o.device) == (
        None,
        None,
        "overwrite",
        None,
        None,
        None,
    )
    assert (o.provenance, o.allow_unchanged, o.ptd_store) == (True, False, None)
    assert o.refuses_unchanged
    assert not RunOptions(allow_unchanged=True).refuses_unchanged
    assert not RunOptions(strict=False).refuses_unchanged
    assert RunOptions(strict=True).refuses_unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.mode = "create"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "append"}, "mode must be 'overwrite' or 'create', got 'append'"),
        ({"strict": "yes"}, "strict must be True, False or None, got 'yes'"),
        ({"allow_unchanged": 1}, "allow_unchanged must be True or False, got 1"),
        (
            {"strict": True, "allow_unchanged": True},
            "strict=True and allow_unchanged=True contradict each other: pass one of them",
        ),
    ],
)
def test_a_bad_option_is_refused_when_the_record_is_made(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"^{message}$"):
        RunOptions(**kwargs)
    # the same message from the pipeline's keyword arguments, before anything is read
    assert MLP.pte_path is not None
    out = tmp_path / "out.pte"
    with (
        open_loader(MLP.pte_path) as loader,
        open_writer(out) as writer,
        pytest.raises(ConfigurationError, match=f"^{message}$"),
    ):
        initialize_and_save_backend_data(loader, writer, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_a_ptd_loader_needs_its_writer(tmp_path: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    with (
        open_loader(EXT.pte_path) as pte,
        open_loader(EXT.ptd_path) as ptd,
        open_writer(tmp_path / "out.pte") as writer,
        pytest.raises(
            ConfigurationError, match=r"^ptd_loader and ptd_writer must be given together$"
        ),
    ):
        initialize_and_save_backend_data(pte, writer, ptd_loader=ptd)


def test_every_keyword_still_reaches_its_step(tmp_path: Path) -> None:
    """A pair run through the keyword arguments: backends, the tracer, the mode, the
    spool directory, allow_unchanged and provenance each do what they say."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    events: list[Event] = []
    spool = tmp_path / "spool"
    spool.mkdir()
    out_pte, out_ptd = tmp_path / "out.pte", tmp_path / "out.ptd"
    with (
        open_loader(EXT.pte_path) as pte,
        open_loader(EXT.ptd_path) as ptd,
        open_writer(out_pte) as pte_w,
        open_writer(out_ptd) as ptd_w,
    ):
        report = initialize_and_save_backend_data(
            pte,
            pte_w,
            ptd_loader=ptd,
            ptd_writer=ptd_w,
            backends=["passthrough"],
            event_tracer=events.append,
            mode="create",
            spool_dir=str(spool),
            allow_unchanged=False,
            provenance=False,
        )
    assert [f.status for f in report.files] == ["written", "written"]
    # passthrough and no provenance: the same bytes
    assert out_pte.read_bytes() == EXT.pte_path.read_bytes()
    assert out_ptd.read_bytes() == EXT.ptd_path.read_bytes()
    kinds = [e.kind for e in events]
    assert kinds[0] == "parsed" and kinds.count("publish") == 2
    assert kinds.index("backend_start") < kinds.index("backend_end") < kinds.index("publish")
    assert list(spool.iterdir()) == []  # the spool was there, and is gone
    # mode="create" reached the publish: a second run refuses to replace the outputs
    with (
        open_loader(EXT.pte_path) as pte,
        open_writer(out_pte) as pte_w,
        pytest.raises(AlreadyExists, match=f"^{out_pte}: already exists"),
    ):
        initialize_and_save_backend_data(
            pte, pte_w, backends=["passthrough"], mode="create", provenance=False
        )


def test_a_backend_list_given_as_one_string_is_refused(tmp_path: Path) -> None:
    """``backends="passthrough"`` used to be read one character a backend ("backend
    'p': unknown name"): refused naming the argument, by ``specialize`` and by the
    pipeline's options alike; a path given as None or bytes is named too."""
    import ptestore

    message = (
        "backends must be a list of backend SPECs or objects, got the str 'passthrough' "
        "(iterated, it would be read an item at a time, each character a backend): pass "
        "backends=['passthrough']"
    )
    out = tmp_path / "out.pte"
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(MLP.pte_path, out, backends="passthrough")  # type: ignore[arg-type]
    assert str(err.value) == message
    with pytest.raises(ConfigurationError) as err:
        RunOptions(backends="passthrough")  # type: ignore[arg-type]
    assert str(err.value) == message
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(None, out)  # type: ignore[arg-type]
    assert str(err.value) == "src_url must be a path or URL (a str or os.PathLike), got None"
    with pytest.raises(ConfigurationError) as err:
        ptestore.specialize(MLP.pte_path, bytes(out))  # type: ignore[arg-type]
    assert str(err.value) == (
        f"dst_url must be a path or URL (a str or os.PathLike), got bytes {bytes(out)!r}"
    )
    assert not out.exists()
