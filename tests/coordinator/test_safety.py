"""Hostile pairs and programs the coordinator must refuse before publishing anything.

- destination collisions: a destination that is a source or the other destination,
  however it is spelled (symlinks, hard links, ``./``, ``file://``, ``s3a://``,
  repeated slashes), refused before any work, in ``create`` mode too;
- segments with users of different kinds (a named-data key that is also the constant
  segment or a mutable data segment; a delegate blob shared by two backends, or by one
  backend with different compile specs), built for the purpose below: replacing one is
  refused, passthrough still copies them byte for byte.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flatbuffers
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
)
from ptestore.errors import ConfigurationError, InvalidReplacement
from ptestore.format import parse
from ptestore.storage.loaders import open_loader
from ptestore.writers import open_writer

EXT = get_fixture("mlp_xnnpack_ext")
assert EXT.pte_path is not None and EXT.ptd_path is not None
PAIR_RULE = "every destination must differ from both sources and from the other destination"


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte, ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    pte.write_bytes(EXT.pte_path.read_bytes())
    ptd.write_bytes(EXT.ptd_path.read_bytes())
    return pte, ptd


def assert_pair_untouched(pte: Path, ptd: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    assert pte.read_bytes() == EXT.pte_path.read_bytes()
    assert ptd.read_bytes() == EXT.ptd_path.read_bytes()
    assert sorted(os.listdir(pte.parent)) == sorted({pte.name, ptd.name} | _extra(pte.parent))


def _extra(d: Path) -> set[str]:
    return {p for p in os.listdir(d) if p in {"link.pte", "hard.pte", "sub", "out.pte"}}


def refused(pattern: str, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(*args, backends=["passthrough"], **kwargs)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)


# ------------------------------------------------------------------ 13.1 collisions
@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_ptd_destination_onto_the_source_pte(pair: tuple[Path, Path], mode: str) -> None:
    pte, ptd = pair
    out = pte.parent / "out.pte"
    refused(
        rf"the destination \.ptd and the source \.pte are the same file, {re.escape(str(pte))}: "
        rf"would replace the \.pte; {PAIR_RULE}",
        pte,
        out,
        ptd=(ptd, pte),
        mode=mode,
    )
    assert not out.exists()
    assert_pair_untouched(pte, ptd)


@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_pte_destination_onto_the_source_ptd(pair: tuple[Path, Path], mode: str) -> None:
    pte, ptd = pair
    out = pte.parent / "out.ptd"
    refused(
        rf"the destination \.pte and the source \.ptd are the same file, {re.escape(str(ptd))}: "
        rf"would replace the \.ptd; {PAIR_RULE}",
        pte,
        ptd,
        ptd=(ptd, out),
        mode=mode,
    )
    assert not out.exists()
    assert_pair_untouched(pte, ptd)


@pytest.mark.parametrize("mode", ["overwrite", "create"])
def test_both_destinations_one_file(pair: tuple[Path, Path], mode: str) -> None:
    pte, ptd = pair
    out = pte.parent / "out.pte"
    refused(
        rf"the destination \.ptd and the destination \.pte are the same file, "
        rf"{re.escape(str(out))}: the \.pte would be published over the new \.ptd; {PAIR_RULE}",
        pte,
        out,
        ptd=(ptd, out),
        mode=mode,
    )
    assert not out.exists()


def test_source_pte_given_as_its_own_ptd(pair: tuple[Path, Path]) -> None:
    pte, _ = pair
    d = pte.parent
    refused(
        rf"the source \.ptd and the source \.pte are the same file, {re.escape(str(pte))}: "
        rf"a \.pte is not its own \.ptd; {PAIR_RULE}",
        pte,
        d / "a.pte",
        ptd=(pte, d / "a.ptd"),
    )
    assert not (d / "a.pte").exists() and not (d / "a.ptd").exists()


def test_collisions_through_other_spellings(pair: tuple[Path, Path], monkeypatch: Any) -> None:
    """Symlinks (to the file or to its directory), hard links, relative paths and
    ``file://`` URLs name the same file; both spellings are in the message."""
    pte, ptd = pair
    d = pte.parent
    (d / "link.pte").symlink_to(pte)
    os.link(pte, d / "hard.pte")
    (d / "sub").symlink_to(d, target_is_directory=True)
    monkeypatch.chdir(d)
    for alias in (
        str(d / "link.pte"),
        str(d / "hard.pte"),
        str(d / "sub" / "m.pte"),
        "./m.pte",
        f"sub/../{d.name}/m.pte",  # sub -> d: the kernel's sub/.. is d's parent
        f"file://{pte}",
    ):
        refused(
            rf"the destination \.ptd and the source \.pte are the same file, "
            rf"{re.escape(alias)} \({re.escape(str(pte))}\): would replace the \.pte; "
            rf"{PAIR_RULE}",
            pte,
            d / "out.pte",
            ptd=(ptd, alias),
        )
    assert_pair_untouched(pte, ptd)
    assert not (d / "out.pte").exists()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("memory://bucket/m.pte", "memory:///bucket//m.pte"),
        ("s3://bucket/m.pte", "s3a://bucket//m.pte"),
        ("S3://bucket/m.pte", "s3://bucket/m.pte"),
        ("gcs://bucket/dir/m.pte", "gcs://bucket/dir//m.pte/"),
    ],
)
def test_collisions_between_url_spellings(a: str, b: str) -> None:
    """URLs are normalized (scheme, repeated and trailing slashes) and the check runs
    before any storage is contacted: nothing here exists."""
    refused(
        rf"the destination \.ptd and the source \.pte are the same file, {re.escape(b)} "
        rf"\({re.escape(a)}\): would replace the \.pte; {PAIR_RULE}",
        a,
        "memory://elsewhere/out.pte",
        ptd=("memory://bucket/m.ptd", b),
    )


def test_in_place_pair_spelled_differently_is_refused(pair: tuple[Path, Path]) -> None:
    pte, ptd = pair
    (pte.parent / "link.pte").symlink_to(pte)
    refused(
        r"in-place specialization of a \.pte/\.ptd pair is refused \(.*m\.pte -> .*link\.pte\): "
        r"the two files cannot be published in one atomic step; write the pair to new names",
        pte,
        pte.parent / "link.pte",
        ptd=(ptd, pte.parent / "new.ptd"),
    )
    assert_pair_untouched(pte, ptd)


def test_distinct_pair_still_works(pair: tuple[Path, Path]) -> None:
    pte, ptd = pair
    d = pte.parent
    report = ptestore.specialize(
        pte,
        d / "o.pte",
        ptd=(ptd, d / "o.ptd"),
        backends=["passthrough"],
        mode="create",
        provenance=False,
    )
    assert [f.role for f in report.files] == ["pte", "ptd"]
    assert (d / "o.ptd").read_bytes() == ptd.read_bytes()


def test_low_level_api_checks_writers_too(pair: tuple[Path, Path]) -> None:
    """initialize_and_save_backend_data with loaders and writers: one writer for both
    files, or a writer onto the other file's source, is refused before any work."""
    pte, ptd = pair
    d = pte.parent
    loaders = [open_loader(pte), open_loader(ptd)]
    try:
        same = open_writer(d / "out.pte")
        with pytest.raises(ConfigurationError) as info:
            ptestore.initialize_and_save_backend_data(
                loaders[0], same, ptd_loader=loaders[1], ptd_writer=same, backends=[]
            )
        assert str(info.value) == (
            f"pte_writer and ptd_writer are one writer ({d / 'out.pte'}): the .pte would be "
            "published over the new .ptd; give each file its own writer"
        )
        onto = open_writer(pte)
        with pytest.raises(ConfigurationError, match=r"the destination \.ptd and the source \.pte"):
            ptestore.initialize_and_save_backend_data(
                loaders[0],
                open_writer(d / "o.pte"),
                ptd_loader=loaders[1],
                ptd_writer=onto,
                backends=[],
            )
    finally:
        for loader in loaders:
            loader.close()
    assert_pair_untouched(pte, ptd)
    assert not (d / "out.pte").exists() and not (d / "o.pte").exists()


# ------------------------------------------------------------------ programs built for 13.3
SEGMENT_ALIGNMENT = 16


@dataclass
class Deleg:
    """A delegate whose processed blob is segment ``segment``."""

    backend_id: str
    segment: int
    specs: dict[str, bytes] = field(default_factory=dict)
    method: str = "forward"


def _u64_vector(b: flatbuffers.Builder, values: list[int]) -> int:
    b.StartVector(8, len(values), 8)
    for v in reversed(values):
        b.PrependUint64(v)
    return int(b.EndVector())


def _offsets(b: flatbuffers.Builder, items: list[int]) -> int:
    b.StartVector(4, len(items), 4)
    for item in reversed(items):
        b.PrependUOffsetTRelative(item)
    return int(b.EndVector())


def _subsegment(b: flatbuffers.Builder, index: int, offsets: list[int]) -> int:
    vec = _u64_vector(b, offsets)
    b.StartObject(2)
    b.PrependUint32Slot(0, index, 0)
    b.PrependUOffsetTRelativeSlot(1, vec, 0)
    return int(b.EndObject())


def build_pte(
    segments: list[bytes],
    *,
    named: list[tuple[str, int]] | None = None,
    delegates: list[Deleg] | None = None,
    constant: tuple[int, list[int]] | None = None,
    mutable: list[tuple[int, list[int]]] | None = None,
) -> bytes:
    """A .pte with an extended header, ``segments`` (16-byte aligned), named data
    ``(key, segment)``, ``delegates``, the constant segment ``(segment, offsets)`` and
    mutable data segments. ExecuTorch's own ``deserialize_pte_binary`` reads it (its
    mutable data comes from the segment named here)."""
    named = named or []
    delegates = delegates or []
    mutable = mutable or []
    offsets: list[int] = []
    pos = 0
    for data in segments:
        offsets.append(pos)
        pos += -(-len(data) // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
    b = flatbuffers.Builder(0)
    b.ForceDefaults(True)
    seg_tables = []
    for off, data in zip(offsets, segments, strict=True):
        b.StartObject(2)
        b.PrependUint64Slot(0, off, 0)
        b.PrependUint64Slot(1, len(data), 0)
        seg_tables.append(b.EndObject())
    seg_vec = _offsets(b, seg_tables)
    named_tables = []
    for key, index in named:
        k = b.CreateString(key)
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, k, 0)
        b.PrependUint32Slot(1, index, 0)
        named_tables.append(b.EndObject())
    named_vec = _offsets(b, named_tables) if named_tables else None
    methods: dict[str, list[int]] = {}
    for d in delegates:
        spec_tables = []
        for key, value in d.specs.items():
            kk = b.CreateString(key)
            vv = b.CreateByteVector(value)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, kk, 0)
            b.PrependUOffsetTRelativeSlot(1, vv, 0)
            spec_tables.append(b.EndObject())
        specs = _offsets(b, spec_tables) if spec_tables else None
        bid = b.CreateString(d.backend_id)
        b.StartObject(2)  # BackendDelegateDataReference
        b.PrependUint8Slot(0, 1, 0)  # SEGMENT
        b.PrependUint32Slot(1, d.segment, 0)
        ref = b.EndObject()
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, bid, 0)
        b.PrependUOffsetTRelativeSlot(1, ref, 0)
        if specs is not None:
            b.PrependUOffsetTRelativeSlot(2, specs, 0)
        methods.setdefault(d.method, []).append(b.EndObject())
    plans = []
    for name, ds in (methods or {"forward": []}).items():
        dvec = _offsets(b, ds)
        n = b.CreateString(name)
        b.StartObject(8)
        b.PrependUOffsetTRelativeSlot(0, n, 0)
        b.PrependUOffsetTRelativeSlot(7, dvec, 0)
        plans.append(b.EndObject())
    plan_vec = _offsets(b, plans)
    const = _subsegment(b, *constant) if constant is not None else None
    mut = [_subsegment(b, i, offs) for i, offs in mutable]
    mut_vec = _offsets(b, mut) if mut else None
    empty_buffers = _offsets(b, [])
    empty_inline = _offsets(b, [])
    b.StartObject(8)
    b.PrependUint32Slot(0, 0, 0)
    b.PrependUOffsetTRelativeSlot(1, plan_vec, 0)
    b.PrependUOffsetTRelativeSlot(2, empty_buffers, 0)
    b.PrependUOffsetTRelativeSlot(3, empty_inline, 0)
    b.PrependUOffsetTRelativeSlot(4, seg_vec, 0)
    if const is not None:
        b.PrependUOffsetTRelativeSlot(5, const, 0)
    if mut_vec is not None:
        b.PrependUOffsetTRelativeSlot(6, mut_vec, 0)
    if named_vec is not None:
        b.PrependUOffsetTRelativeSlot(7, named_vec, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"ET12")
    fb = bytearray(b.Output())
    # Splice the 32-byte extended header in after the identifier (as the exporter does):
    # every FlatBuffer offset is relative, only the root offset moves.
    program_size = len(fb) + 32
    base = -(-program_size // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
    header = b"eh00" + struct.pack("<IQQQ", 32, program_size, base, pos)
    root_off = struct.unpack_from("<I", fb, 0)[0] + 32
    out = bytearray(struct.pack("<I", root_off) + fb[4:8] + header + fb[8:])
    out += bytes(base - len(out))
    for off, data in zip(offsets, segments, strict=True):
        assert len(out) == base + off
        out += data + bytes(-len(data) % SEGMENT_ALIGNMENT)
    return bytes(out)


class Writes(BackendInterface):
    """Serves ``name``; writes ``keys`` and (for each of its inputs) a new blob."""

    def __init__(self, name: str, keys: dict[str, bytes] | None = None, blob: bytes = b"") -> None:
        self.name = name
        self.keys = keys or {}
        self.blob = blob

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for _ in context:
            if self.blob:
                output.write_processed_data(BackendData(self.blob))
        if self.keys:
            output.write_named_data({k: BackendData(v) for k, v in self.keys.items()})


CONST = b"C" * 40
BLOB = b"blob" * 8
WEIGHT = b"W" * 32


#: How the refusals name backend 'A' (the alias check names its spec, as every error does).
BACKEND_A = r"backend 'A' \(coordinator\.test_safety:Writes\)"


def refused_kinds(tmp_path: Path, data: bytes, backends: list[Any], pattern: str) -> None:
    src, dst = tmp_path / "s.pte", tmp_path / "o.pte"
    src.write_bytes(data)
    dst.write_bytes(b"previous content")
    with pytest.raises(InvalidReplacement) as info:
        ptestore.specialize(src, dst, backends=backends, provenance=False)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert dst.read_bytes() == b"previous content"
    assert src.read_bytes() == data
    # Nothing replaced: every user keeps its bytes, the copy is exact.
    ptestore.specialize(src, dst, backends=["passthrough"], provenance=False)
    assert dst.read_bytes() == data


def test_key_on_the_constant_segment_is_refused(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2), ("c", 0)],
        delegates=[Deleg("A", 1)],
        constant=(0, [0, 8]),
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", {"c": b"x" * 40})],
        BACKEND_A + r", key 'c': segment 0 of .*s\.pte has users of different kinds "
        r"\(named data: key 'c'; constant data: the program's constant segment\); replacing "
        r"it would change the bytes of every one of them: refused \(only a segment whose "
        r"users are all named-data keys, or all delegates of one backend with the same "
        r"compile specs, can be replaced\)",
    )


def test_key_on_a_mutable_data_segment_is_refused(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2)],
        delegates=[Deleg("A", 1)],
        constant=(0, [0, 8]),
        mutable=[(2, [0, 16])],
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", {"w": b"y" * 32})],
        BACKEND_A + r", key 'w': segment 2 of .*s\.pte has users of different kinds "
        r"\(named data: key 'w'; mutable data: mutable data segment 0\); .*refused .*",
    )


def test_blob_shared_by_two_backends_is_refused(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2)],
        delegates=[Deleg("A", 1), Deleg("B", 1)],
        constant=(0, [0, 8]),
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", blob=b"for A only")],
        BACKEND_A + r": segment 1 of .*s\.pte has users of different kinds \(delegates of "
        r"backend 'A' without compile specs: delegate forward\[0\]; delegates of backend "
        r"'B' without compile specs: delegate forward\[1\]\); .*refused .*",
    )


def test_blob_shared_by_two_backends_that_both_replace_it(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2)],
        delegates=[Deleg("A", 1), Deleg("B", 1)],
        constant=(0, [0, 8]),
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", blob=b"for A"), Writes("B", blob=b"for B")],
        r"backend 'B' \(coordinator\.test_safety:Writes\), method 'forward': "
        r"processed data of delegate forward\[1\] is shared "
        r"with delegates of backend 'A', which already replaced it: a blob used by delegates "
        r"of different backends cannot be replaced",
    )


def test_blob_shared_with_different_compile_specs_is_refused(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2)],
        delegates=[
            Deleg("A", 1, {"target": b"npu-v1"}),
            Deleg("A", 1, {"target": b"npu-v2"}, method="other"),
        ],
        constant=(0, [0, 8]),
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", blob=b"compiled for npu-v1")],
        BACKEND_A + r": segment 1 of .*s\.pte has users of different kinds \(delegates of "
        r"backend 'A' with compile specs \{target=6e70752d7631\}: delegate forward\[0\]; "
        r"delegates of backend 'A' with compile specs \{target=6e70752d7632\}: delegate "
        r"other\[0\]\); .*refused .*",
    )


def test_blob_and_key_on_one_segment_is_refused(tmp_path: Path) -> None:
    data = build_pte(
        [CONST, BLOB, WEIGHT], named=[("k", 1)], delegates=[Deleg("A", 1)], constant=(0, [0, 8])
    )
    refused_kinds(
        tmp_path,
        data,
        [Writes("A", blob=b"new blob")],
        BACKEND_A + r", key 'k': segment 1 of .*s\.pte has users of different kinds \(named "
        r"data: key 'k'; delegates of backend 'A' without compile specs: delegate "
        r"forward\[0\]\); .*refused .*",
    )


class OtherWrites(Writes):
    """A second implementation class (its own spec)."""


def test_a_refusal_names_every_backend_involved_and_its_spec(tmp_path: Path) -> None:
    """A segment replaced by two backends (A's blob, B's key on it): the refusal, raised
    once every backend has run, names both ids and the spec of each."""
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("k", 1)],
        delegates=[Deleg("A", 1), Deleg("B", 2)],
        constant=(0, [0, 8]),
    )
    a, b = Writes("A", blob=b"new blob"), OtherWrites("B", {"k": b"K" * len(BLOB)})
    refused_kinds(
        tmp_path,
        data,
        [a, b],
        r"backend 'A, B' \(A: coordinator\.test_safety:Writes, B: "
        r"coordinator\.test_safety:OtherWrites\), key 'k': segment 1 of .*s\.pte has users of "
        r"different kinds \(named data: key 'k'; delegates of backend 'A' without compile "
        r"specs: delegate forward\[0\]\); .*refused .*",
    )


def test_users_of_one_kind_are_still_replaced(tmp_path: Path) -> None:
    """The control: one blob shared by delegates of one backend with the same compile
    specs, and two keys on one segment, are replaced for all of them."""
    specs = {"target": b"npu-v1"}
    data = build_pte(
        [CONST, BLOB, WEIGHT],
        named=[("w", 2), ("w_alias", 2)],
        delegates=[Deleg("A", 1, specs), Deleg("A", 1, specs, method="other")],
        constant=(0, [0, 8]),
    )
    src, dst = tmp_path / "s.pte", tmp_path / "o.pte"
    src.write_bytes(data)
    backend = Writes("A", {"w": b"Z" * 32, "w_alias": b"Z" * 32}, blob=b"B" * 24)
    report = ptestore.specialize(src, dst, backends=[backend])
    assert report.backends[0].blobs_replaced == 1
    out = dst.read_bytes()
    c = parse(out, len(out), "o.pte")
    seg = [out[c.segment_base_offset + s.offset :][: s.size] for s in c.segments]
    assert seg == [CONST, b"B" * 24, b"Z" * 32]
