"""The coordinator's semantics on real fixtures, without the runtime.

Every failure path pins its message and checks that nothing was published: the
destination keeps its previous content and the source is untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fixtures import all_fixtures, get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NotSupported,
)
from ptestore.coordinator import Event
from ptestore.errors import (
    AlreadyExists,
    BackendError,
    ConfigurationError,
    InvalidReplacement,
    StorageError,
)
from ptestore.format import parse
from ptestore.format.layout import choose_base, plan_layout
from ptestore.format.model import TensorLayout, inferred_alignment

MLP = get_fixture("mlp_xnnpack")
assert MLP.pte_path is not None
MLP_KEYS = [e["key"] for e in MLP.facts["pte"]["named_data"]]


class Backend(BackendInterface):
    """A configurable test backend."""

    def __init__(self, name: str = "XnnpackBackend", action: Any = None) -> None:
        self.name = name
        self.action = action
        self.calls = 0
        self.inputs: list[Any] = []

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        self.calls += 1
        for item in context:
            self.inputs.append(item)
        if self.action is not None:
            self.action(context, output)


def seg_bytes(data: bytes, index: int) -> bytes:
    c = parse(data, len(data), "x")
    s = c.segments[index]
    return data[c.segment_base_offset + s.offset :][: s.size]


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    p = tmp_path / "out.pte"
    p.write_bytes(b"previous content")
    return p


def assert_untouched(src: Path, dst: Path) -> None:
    assert MLP.pte_path is not None
    assert src.read_bytes() == MLP.pte_path.read_bytes()
    assert dst.read_bytes() == b"previous content"
    leftovers = [p for p in os.listdir(dst.parent) if p not in {"model.pte", "out.pte"}]
    assert leftovers == []


def run_failing(src: Path, dst: Path, backend: BackendInterface, pattern: str) -> BackendError:
    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, dst, backends=[backend])
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert_untouched(src, dst)
    return info.value


# ------------------------------------------------------------------ happy paths
def test_passthrough_of_an_exporter_file_is_byte_identical(src: Path, dst: Path) -> None:
    report = ptestore.specialize(src, dst, backends=["passthrough"], provenance=False)
    assert dst.read_bytes() == src.read_bytes()
    (b,) = report.backends
    assert (b.backend_id, b.status, b.inputs_seen, b.keys_replaced) == (
        "XnnpackBackend",
        "specialized",
        1,
        [],
    )
    (f,) = report.files
    assert (f.size_before, f.size_after, f.segments_moved, f.redirected_tables) == (
        6048,
        6048,
        0,
        0,
    )


def test_each_backend_id_called_once_and_unknown_ids_kept(src: Path, dst: Path) -> None:
    other = Backend("SomeOtherBackend")
    xnn = Backend("XnnpackBackend")
    report = ptestore.specialize(
        src, dst, backends=[other, xnn], allow_unchanged=True, provenance=False
    )
    assert (xnn.calls, other.calls) == (1, 0)
    assert len(xnn.inputs) == 1
    assert xnn.inputs[0].method == "forward"
    assert report.backends[0].status == "not_supported"  # it wrote nothing: it declined
    report = ptestore.specialize(src, dst, backends=[other], allow_unchanged=True, provenance=False)
    assert report.backends[0].status == "no_implementation"
    assert dst.read_bytes() == src.read_bytes()


def test_not_supported_keeps_data_even_after_writes(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(MLP_KEYS[0], BackendData(b"\0" * 16, allow_size_change=True))
        raise NotSupported("not on this device")

    report = ptestore.specialize(
        src, dst, backends=[Backend(action=action)], allow_unchanged=True, provenance=False
    )
    assert report.backends[0].status == "not_supported"
    assert report.backends[0].keys_replaced == []
    assert dst.read_bytes() == src.read_bytes()


def test_default_backend_raises_not_supported(src: Path, dst: Path) -> None:
    class Plain(BackendInterface):
        name = "XnnpackBackend"

    report = ptestore.specialize(src, dst, backends=[Plain()], allow_unchanged=True)
    assert report.backends[0].status == "not_supported"


def test_shared_blob_is_visited_once_with_every_delegate(tmp_path: Path) -> None:
    fx = get_fixture("shared_blob_xnnpack")
    assert fx.pte_path is not None
    backend = Backend()
    ptestore.specialize(fx.pte_path, tmp_path / "o.pte", backends=[backend], allow_unchanged=True)
    delegates = fx.facts["pte"]["delegates"]
    blobs = {(d["location"], d["index"]) for d in delegates}
    assert len(backend.inputs) == len(blobs) < len(delegates)
    assert sum(len(i.delegates) for i in backend.inputs) == len(delegates)
    assert any(len(i.methods) > 1 for i in backend.inputs)


def test_named_data_map_merges_ptd_over_pte(tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    seen: dict[str, Any] = {}

    def action(ctx: Any, out: Any) -> None:
        m = ctx.get_named_data_map()
        seen["keys"] = sorted(m.keys())
        seen["data"] = {k: hashlib.sha256(m.get_data(k)).hexdigest() for k in m}

    ptestore.specialize(
        fx.pte_path,
        tmp_path / "o.pte",
        ptd=(fx.ptd_path, tmp_path / "o.ptd"),
        backends=[Backend(action=action)],
        allow_unchanged=True,
    )
    ptd_keys = sorted(e["key"] for e in fx.facts["ptd"]["named_data"])
    assert seen["keys"] == sorted(set(ptd_keys) | {e["key"] for e in fx.facts["pte"]["named_data"]})
    # XNNPACK keys are the SHA-256 of their portable bytes.
    assert all(seen["data"][k] == k for k in ptd_keys)


def test_smaller_replacement_shrinks_the_file_and_keeps_order(src: Path, dst: Path) -> None:
    key = MLP_KEYS[0]  # fc1.weight, 2048 bytes in segment 2

    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(key, BackendData(b"\x11" * 100, allow_size_change=True))

    report = ptestore.specialize(src, dst, backends=[Backend(action=action)], provenance=False)
    new = dst.read_bytes()
    c0 = parse(src.read_bytes(), src.stat().st_size, "src")
    c1 = parse(new, len(new), "dst")
    assert len(new) < src.stat().st_size
    assert report.files[0].size_after == len(new)
    assert seg_bytes(new, 2) == b"\x11" * 100
    offsets = [s.offset for s in c1.segments]
    assert offsets == sorted(offsets)
    for s0, s1 in zip(c0.segments, c1.segments, strict=True):
        a0 = inferred_alignment(c0.segment_base_offset + s0.offset)
        assert (c1.segment_base_offset + s1.offset) % a0 == 0  # never weakened
        if s0.index != 2:
            assert seg_bytes(new, s0.index) == seg_bytes(src.read_bytes(), s0.index)
    # No orphan bytes: the file ends with the last segment.
    assert len(new) == c1.segment_base_offset + c1.segment_end()


def test_requested_alignment_is_honoured(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(
            MLP_KEYS[3], BackendData(b"\x22" * 40, alignment=8192, allow_size_change=True)
        )

    ptestore.specialize(src, dst, backends=[Backend(action=action)])
    new = dst.read_bytes()
    c = parse(new, len(new), "dst")
    s = c.segments[5]
    assert (c.segment_base_offset + s.offset) % 8192 == 0
    assert seg_bytes(new, 5) == b"\x22" * 40


def test_processed_blob_replacement(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        pass

    class Blob(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            item = context.next_backend_data()
            assert bytes(item.processed[4:8]) == b"XH00"
            output.write_processed_data(BackendData(bytes(item.processed) + b"tail"))
            assert context.next_backend_data() is None

    report = ptestore.specialize(src, dst, backends=[Blob()])
    assert report.backends[0].blobs_replaced == 1
    assert seg_bytes(dst.read_bytes(), 1) == seg_bytes(src.read_bytes(), 1) + b"tail"


def test_events_and_report(src: Path, dst: Path) -> None:
    events: list[Event] = []

    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(MLP_KEYS[1], BackendData(b"\x01" * 128, allow_size_change=True))

    report = ptestore.specialize(
        src, dst, backends=[Backend(action=action)], event_tracer=events.append
    )
    kinds = [e.kind for e in events]
    assert kinds[0] == "parsed"
    assert kinds.index("backend_start") < kinds.index("input") < kinds.index("replacement")
    assert kinds.index("replacement") < kinds.index("backend_end") < kinds.index("write")
    assert kinds[-1] == "publish"
    writes = [e for e in events if e.kind == "write"]
    assert writes[-1].done == writes[-1].total == sum(e.nbytes for e in writes)
    d = report.to_dict()
    assert d["backends"][0]["keys_replaced"] == [MLP_KEYS[1]]
    assert d["backends"][0]["bytes_out"] == 128
    assert d["backends"][0]["bytes_in"] == 1184  # the delegate blob
    assert d["files"][0]["bytes_replaced"] == 128


def test_create_mode_refuses_existing_destination(src: Path, dst: Path) -> None:
    with pytest.raises(AlreadyExists):
        ptestore.specialize(src, dst, backends=["passthrough"], mode="create")
    assert_untouched(src, dst)


def test_in_place_replacement(src: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(MLP_KEYS[3], BackendData(b"\x05" * 32, allow_size_change=True))

    ptestore.specialize(src, src, backends=[Backend(action=action)])
    assert seg_bytes(src.read_bytes(), 5) == b"\x05" * 32


def test_in_place_pair_is_refused(tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    with pytest.raises(ConfigurationError, match=r"in-place specialization of a \.pte/\.ptd pair"):
        ptestore.specialize(
            fx.pte_path, tmp_path / "o.pte", ptd=(fx.ptd_path, fx.ptd_path), backends=[]
        )


# ------------------------------------------------------------------ failure paths
def test_unknown_key(src: Path, dst: Path) -> None:
    run_failing(
        src,
        dst,
        Backend(action=lambda c, o: o.write_named_data("nope", BackendData(b"x"))),
        r"backend 'XnnpackBackend' \(coordinator\.test_coordinator:[\w.<>]+\), "
        r"method 'forward', key "
        r"'nope': unknown key: backends may only "
        r"replace existing keys \(4 keys in the model\); no new keys",
    )


def test_key_written_twice(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data({MLP_KEYS[0]: BackendData(b"a", allow_size_change=True)})
        out.write_named_data(MLP_KEYS[0], BackendData(b"b", allow_size_change=True))

    err = run_failing(
        src,
        dst,
        Backend(action=action),
        rf"backend 'XnnpackBackend' \(coordinator\.test_coordinator:[\w.<>]+\), "
        r"method 'forward', key "
        rf"'{MLP_KEYS[0]}': key written twice "
        r"\(first by backend 'XnnpackBackend'\)",
    )
    assert isinstance(err, InvalidReplacement)
    assert err.key == MLP_KEYS[0]


@pytest.mark.parametrize("alignment", [3, 0, -8, 1 << 21])
def test_bad_alignment(src: Path, dst: Path, alignment: int) -> None:
    run_failing(
        src,
        dst,
        Backend(
            action=lambda c, o: o.write_named_data(
                MLP_KEYS[0], BackendData(b"x", alignment=alignment, allow_size_change=True)
            )
        ),
        rf".*key '{MLP_KEYS[0]}': write_named_data: alignment {alignment} must be a power of two "
        r"in \[1, 1048576\]",
    )


@pytest.mark.parametrize(
    ("alignment", "said"),
    [
        # True is not 1: a bool is refused as a flag given where a number belongs.
        (True, "True is a bool, not an int: give"),
        (False, "False is a bool, not an int: give"),
        # A numpy integer is refused as for every integer argument of the API.
        (np.int64(64), "np.int64(64) is a numpy.int64, not an int: pass int(alignment),"),
        ("64", "'64' is a str, not an int: give"),
    ],
)
@pytest.mark.parametrize("chunked", [False, True])
def test_alignment_is_an_int(
    src: Path, dst: Path, alignment: object, said: str, chunked: bool
) -> None:
    def write(c: Any, o: Any) -> None:
        size = c.get_named_data_map().get_data_size(MLP_KEYS[0])
        if chunked:
            o.write_named_data_chunks(MLP_KEYS[0], size, [b"x" * size], alignment=alignment)
        else:
            o.write_named_data(MLP_KEYS[0], BackendData(b"x" * size, alignment=alignment))  # type: ignore[arg-type]

    what = "write_named_data_chunks" if chunked else "write_named_data"
    run_failing(
        src,
        dst,
        Backend(action=write),
        rf".*key '{MLP_KEYS[0]}': {what}: alignment {re.escape(said)} a power of two in "
        r"\[1, 1048576\]",
    )


def test_data_must_be_bytes_like(src: Path, dst: Path) -> None:
    run_failing(
        src,
        dst,
        Backend(action=lambda c, o: o.write_named_data(MLP_KEYS[0], BackendData("text"))),  # type: ignore[arg-type]
        r".*write_named_data: BackendData.data must be bytes-like \(bytes, bytearray, "
        r"memoryview or a C-contiguous numpy array\), got str",
    )


def test_processed_without_current_input(src: Path, dst: Path) -> None:
    class Early(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            output.write_processed_data(BackendData(b"x"))

    run_failing(
        src,
        dst,
        Early(),
        r"backend 'XnnpackBackend' \(coordinator\.test_coordinator:[\w.<>]+\): "
        r"write_processed_data "
        r"called with no current delegate input "
        r"\(call next_backend_data first\)",
    )


def test_backend_exception_names_backend_method_and_key(src: Path, dst: Path) -> None:
    class Boom(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            context.next_backend_data()
            context.get_named_data_map().get_data(MLP_KEYS[2])
            raise RuntimeError("compiler crashed")

    err = run_failing(
        src,
        dst,
        Boom(),
        rf"backend 'XnnpackBackend' \(coordinator\.test_coordinator:[\w.<>]+\), "
        r"method 'forward', key "
        rf"'{MLP_KEYS[2]}': "
        r"initialize_backend_data failed: RuntimeError: compiler crashed",
    )
    assert (err.backend, err.method, err.key) == ("XnnpackBackend", "forward", MLP_KEYS[2])
    assert isinstance(err.__cause__, RuntimeError)


def test_keyboard_interrupt_discards(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(MLP_KEYS[0], BackendData(b"x", allow_size_change=True))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ptestore.specialize(src, dst, backends=[Backend(action=action)])
    assert_untouched(src, dst)


def test_inconsistent_aliases_are_refused(tmp_path: Path) -> None:
    fx = get_fixture("scale_alias_xnnpack")
    assert fx.pte_path is not None
    named = fx.facts["pte"]["named_data"]
    shared = [e["key"] for e in named if e["segment_index"] == 3]
    assert len(shared) == 2
    dst = tmp_path / "o.pte"
    dst.write_bytes(b"previous content")

    one = Backend(
        action=lambda c, o: o.write_named_data(
            shared[0], BackendData(b"\1" * 8, allow_size_change=True)
        )
    )
    with pytest.raises(InvalidReplacement) as info:
        ptestore.specialize(fx.pte_path, dst, backends=[one])
    assert re.fullmatch(
        rf"backend 'XnnpackBackend' \(coordinator\.test_coordinator:Backend\), "
        rf"key '{shared[1]}': segment 3 of .*scale_alias_xnnpack\.pte "
        rf"is shared by key '{shared[0]}', key '{shared[1]}'; key '{shared[1]}' not replaced: "
        r"replace every alias with identical bytes",
        str(info.value),
    ), str(info.value)
    assert dst.read_bytes() == b"previous content"

    def different(ctx: Any, out: Any) -> None:
        out.write_named_data(
            {
                shared[0]: BackendData(b"\1" * 8, allow_size_change=True),
                shared[1]: BackendData(b"\2" * 8, allow_size_change=True),
            }
        )

    with pytest.raises(InvalidReplacement, match="replaced with different bytes"):
        ptestore.specialize(fx.pte_path, dst, backends=[Backend(action=different)])
    assert dst.read_bytes() == b"previous content"

    def same(ctx: Any, out: Any) -> None:
        out.write_named_data({k: BackendData(b"\3" * 8, allow_size_change=True) for k in shared})

    ptestore.specialize(fx.pte_path, dst, backends=[Backend(action=same)])
    assert seg_bytes(dst.read_bytes(), 3) == b"\3" * 8


def test_tensor_layout_cannot_change(tmp_path: Path) -> None:
    fx = get_fixture("mlp_xnnpack_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    key = fx.facts["ptd"]["named_data"][0]["key"]
    dst = tmp_path / "o.pte"
    bad = TensorLayout(6, (1, 2), (0, 1))

    with pytest.raises(InvalidReplacement, match=r"tensor layout .* differs from the key's layout"):
        ptestore.specialize(
            fx.pte_path,
            dst,
            ptd=(fx.ptd_path, tmp_path / "o.ptd"),
            backends=[
                Backend(action=lambda c, o: o.write_named_data(key, BackendData(b"x", layout=bad)))
            ],
        )
    assert not dst.exists()
    assert not (tmp_path / "o.ptd").exists()


class FailingWriter:
    """A real writer whose storage fails after some bytes (a full disk)."""

    def __init__(self, inner: Any, fail_after: int) -> None:
        self.inner = inner
        self.url = inner.url
        self.left = fail_after

    def write(self, data: Any, offset: int) -> None:
        self.left -= len(data)
        if self.left < 0:
            raise StorageError(f"{self.url}: No space left on device")
        self.inner.write(data, offset)

    def copy_from(self, loader: Any, src_offset: int, size: int, dst_offset: int) -> None:
        self.write(loader.load(src_offset, size), dst_offset)

    def publish(self, mode: str = "overwrite") -> Any:
        return self.inner.publish(mode)

    def discard(self) -> None:
        self.inner.discard()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # the rest of the DataWriter interface


def test_storage_failure_discards(src: Path, dst: Path) -> None:
    with ptestore.open_loader(src) as loader:
        writer = FailingWriter(ptestore.open_writer(dst), 3000)
        with pytest.raises(StorageError, match="No space left on device"):
            ptestore.initialize_and_save_backend_data(loader, writer, backends=["passthrough"])
    assert_untouched(src, dst)


def test_memory_destination_untouched_on_failure() -> None:
    import fsspec

    assert MLP.pte_path is not None
    fs = fsspec.filesystem("memory")
    fs.pipe("/coord-test/in.pte", MLP.pte_path.read_bytes())
    fs.pipe("/coord-test/out.pte", b"old")
    with pytest.raises(BackendError):
        ptestore.specialize(
            "memory://coord-test/in.pte",
            "memory://coord-test/out.pte",
            backends=[Backend(action=lambda c, o: o.write_named_data("x", BackendData(b"")))],
            provenance=False,
        )
    assert fs.cat_file("/coord-test/out.pte") == b"old"
    ptestore.specialize(
        "memory://coord-test/in.pte",
        "memory://coord-test/out.pte",
        backends=["passthrough"],
        provenance=False,
    )
    assert fs.cat_file("/coord-test/out.pte") == MLP.pte_path.read_bytes()


def test_plan_layout_never_weakens_alignment() -> None:
    fx = get_fixture("mlp_xnnpack_align4096")
    assert fx.pte_path is not None
    data = fx.pte_path.read_bytes()
    c = parse(data, len(data), "x")
    base = choose_base(c)
    assert base % 4096 == 0
    placements = plan_layout(c, {2: (10, 1)}, base)
    for s, (off, _) in zip(c.segments, placements, strict=True):
        if s.size:
            assert (base + off) % 4096 == 0
    # Unchanged, the layout is the original one.
    assert plan_layout(c, {}) == [(s.offset, s.size) for s in c.segments]


def test_doubled_weight_bytes_without_runtime(src: Path, dst: Path) -> None:
    fx = MLP
    assert fx.doubled is not None and fx.doubled.key is not None
    key = fx.doubled.key

    def action(ctx: Any, out: Any) -> None:
        value = bytes(ctx.get_named_data_map().get_data(key))
        out.write_named_data(key, BackendData(fx.doubled.doubled_value(value)))  # type: ignore[union-attr]

    ptestore.specialize(src, dst, backends=[Backend(action=action)])
    index = next(e["segment_index"] for e in fx.facts["pte"]["named_data"] if e["key"] == key)
    before = np.frombuffer(seg_bytes(src.read_bytes(), index), dtype=np.float32)
    after = np.frombuffer(seg_bytes(dst.read_bytes(), index), dtype=np.float32)
    np.testing.assert_array_equal(after, before * 2)


@pytest.mark.parametrize(
    "fx", [f for f in all_fixtures() if f.pte_path is not None], ids=lambda f: f.name
)
def test_passthrough_is_identity_on_exporter_files_and_idempotent(fx: Any, tmp_path: Path) -> None:
    assert fx.pte_path is not None
    ptd = (fx.ptd_path, tmp_path / "a.ptd") if fx.ptd_path else None
    ptestore.specialize(
        fx.pte_path, tmp_path / "a.pte", ptd=ptd, backends=["passthrough"], provenance=False
    )
    first = (tmp_path / "a.pte").read_bytes()
    if not fx.thirdparty:
        assert first == fx.pte_path.read_bytes()
        if fx.ptd_path is not None:
            assert (tmp_path / "a.ptd").read_bytes() == fx.ptd_path.read_bytes()
    ptd2 = (tmp_path / "a.ptd", tmp_path / "b.ptd") if fx.ptd_path else None
    ptestore.specialize(
        tmp_path / "a.pte", tmp_path / "b.pte", ptd=ptd2, backends=["passthrough"], provenance=False
    )
    assert (tmp_path / "b.pte").read_bytes() == first


def test_rewrite_after_growth_is_a_fixed_point(src: Path, tmp_path: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(
            MLP_KEYS[0], BackendData(b"\x07" * 5000, alignment=64, allow_size_change=True)
        )

    ptestore.specialize(
        src, tmp_path / "grown.pte", backends=[Backend(action=action)], provenance=False
    )
    ptestore.specialize(
        tmp_path / "grown.pte", tmp_path / "again.pte", backends=["passthrough"], provenance=False
    )
    assert (tmp_path / "again.pte").read_bytes() == (tmp_path / "grown.pte").read_bytes()
