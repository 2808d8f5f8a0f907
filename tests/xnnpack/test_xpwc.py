"""The packed-weight file's checks, the CPU fingerprint and the native build's refusals.

No runtime here: files are built byte by byte in the layout of ExecuTorch 1.4.1's
XNNWeightsCache (regions, index, 20-byte footer) and every refusal's message is pinned.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from ptestore.errors import ConfigurationError, FormatError
from ptestore.xnnpack.identity import Identity, cpu_fingerprint
from ptestore.xnnpack.native import build_shim
from ptestore.xnnpack.xpwc import (
    MAGIC,
    VERSION,
    Entry,
    check_coverage,
    check_names,
    parse_index,
)

PAGE = 4096


def xpwc(
    entries: list[tuple[str, int, int, int]],
    *,
    regions: int = 2,
    magic: int = MAGIC,
    version: int = VERSION,
    index_start: int | None = None,
    count: int | None = None,
    extra: bytes = b"",
) -> bytes:
    body = bytearray(b"\x11" * (regions * PAGE))
    index = bytearray()
    for name, offset, size, seed in entries:
        raw = name.encode()
        index += struct.pack("<I", len(raw)) + raw + struct.pack("<QQI", offset, size, seed)
    index += extra
    start = len(body) if index_start is None else index_start
    footer = struct.pack("<QIII", start, len(entries) if count is None else count, magic, version)
    return bytes(body + index + footer)


GOOD = [("w1b1", 0, 100, 7), ("w2", PAGE, 200, 0)]


def test_a_well_formed_file_parses() -> None:
    assert parse_index(xpwc(GOOD), "f") == [
        Entry("w1b1", 0, 100, 7),
        Entry("w2", PAGE, 200, 0),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\0" * 19, "f: file size = 19: must be >= 20 (the footer)"),
        (
            xpwc(GOOD, magic=0x12345678),
            "f: footer magic = '0x12345678': must be 0x58505743 ('XPWC')",
        ),
        (xpwc(GOOD, version=1), "f: footer version = 1: must be 2"),
        (xpwc(GOOD, index_start=1 << 40), f"f: footer index_start = {1 << 40}: must be <= "),
        (xpwc([], count=0), "f: footer entry_count = 0: must be >= 1"),
        (
            xpwc(GOOD, count=3),
            "f: index entry 2 = ",
        ),
        (
            xpwc([("w", 0, 2 * PAGE + 1, 0)]),
            "f: index entry 0 ('w') offset/size = '0/8193': must be a non-empty region "
            "before the index at 8192",
        ),
        (
            xpwc([("w", 0, 0, 0)]),
            "f: index entry 0 ('w') offset/size = '0/0': must be a non-empty region",
        ),
        (
            xpwc([("w", 0, 100, 0)], extra=b"\0\0"),
            "f: index end = ",
        ),
        (
            xpwc([("a", 0, 100, 0), ("a", PAGE, 100, 0)]),
            "f: index entry names = 'duplicates': must be unique",
        ),
        (
            xpwc([("a", 0, PAGE + 1, 0), ("b", PAGE, 100, 0)]),
            "f: region of 'b' = 4096: must be >= 4097 (end of 'a')",
        ),
    ],
)
def test_every_malformed_file_is_refused_with_its_field(data: bytes, message: str) -> None:
    with pytest.raises(FormatError) as err:
        parse_index(data, "f")
    assert str(err.value).startswith(message)


def test_a_name_length_past_the_index_is_refused() -> None:
    data = bytearray(xpwc(GOOD))
    start = 2 * PAGE
    data[start : start + 4] = struct.pack("<I", 10_000)
    with pytest.raises(FormatError) as err:
        parse_index(bytes(data), "f")
    assert str(err.value).startswith("f: index entry 0 name_len = 10000: must be <= ")


@pytest.mark.parametrize("name_len", [10_000, 2])
def test_a_malformed_index_on_disk_is_a_format_error_not_a_buffer_error(
    tmp_path: Path, name_len: int
) -> None:
    """Read through a mapping (:func:`ptestore.xnnpack.record.parse_file`): the refusal
    of an entry past the footer checks leaves no view of the mapping behind (it was a
    ``BufferError: cannot close exported pointers exist``)."""
    from ptestore.xnnpack.record import parse_file

    data = bytearray(xpwc(GOOD))
    start = 2 * PAGE
    data[start : start + 4] = struct.pack("<I", name_len)
    if name_len == 2:
        data[start + 4 : start + 6] = b"\xff\xfe"  # not UTF-8
    path = tmp_path / "bad.xpwc"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError) as err:
        parse_file(path)
    want = (
        "index entry 0 name_len = 10000: must be <= "
        if name_len > 2
        else "index entry 0 name = 'bytes': must be UTF-8"
    )
    assert str(err.value).startswith(f"{path}: {want}")


def test_entry_names_are_keys_or_a_weight_key_and_its_bias_key() -> None:
    entries = parse_index(xpwc(GOOD), "f")
    check_names(entries, {"w1", "b1", "w2"}, "f")
    with pytest.raises(FormatError) as err:
        check_names(entries, {"w1", "w2"}, "f")
    assert str(err.value) == (
        "f: index entry name = 'w1b1': must be one of the artifact's XNNPACK named-data "
        "keys, or a weight key followed by its bias key"
    )


class _Name(str):
    """An entry name that counts what is done with it (prefix tests, slices, searches)."""

    ops = 0

    def startswith(self, *args: object) -> bool:  # type: ignore[override]
        _Name.ops += 1
        return super().startswith(*args)  # type: ignore[arg-type]

    def __getitem__(self, key: object) -> str:  # type: ignore[override]
        _Name.ops += 1
        return super().__getitem__(key)  # type: ignore[index]

    def find(self, *args: object) -> int:  # type: ignore[override]
        _Name.ops += 1
        return super().find(*args)  # type: ignore[arg-type]


def _work_on_names(entries: int, keys: int) -> int:
    """What ``check_names`` does with the names of ``entries`` weight+bias entries of an
    artifact with ``keys`` named-data keys (64 hex digits each, as the runtime's)."""
    names = [f"{i:064x}" for i in range(keys)]
    index = [Entry(_Name(names[2 * i] + names[2 * i + 1]), i * PAGE, 1, 0) for i in range(entries)]
    _Name.ops = 0
    check_names(index, set(names), "f")
    return _Name.ops


def test_checking_the_names_does_not_grow_with_the_number_of_keys() -> None:
    """Each name is split where a key can end, not tried against every key: the work per
    name is the same with 100 keys or 4000 (entries x keys before)."""
    few, many = _work_on_names(50, 100), _work_on_names(50, 4000)
    assert few == many <= 2 * 50


def test_a_name_is_split_at_every_length_a_key_has() -> None:
    keys = {"ab", "abc", "d", "cd"}
    entries = [Entry(n, 0, 1, 0) for n in ("abcd", "abd", "abc", "dcd")]
    check_names(entries, keys, "f")  # abcd: ab+cd and abc+d; abd: ab+d
    for bad in ("abcx", "ddx", "abcabcd", "x"):
        with pytest.raises(FormatError, match=f"index entry name = '{bad}'"):
            check_names([Entry(bad, 0, 1, 0)], keys | {""}, "f")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: mlp_xnnpack's two Linear layers: the filter and bias keys of each, as the runtime
#: names their entries (weight key, then bias key).
FC1 = (
    "9eed8098f924a1e1efe5fd1dfba5ab56b5a8fa3bfbe4bb50eef0b5520f2a05a0",
    "1c0cabf3399f764ea9e4dc4642112c3de10400453e08376ec86dbd004ec5856d",
)
FC2 = (
    "bac88a2607715dd52fa5ab2da37d1cb2b4df4e33a6eef4ccfcc152d756d55c9a",
    "3bf604f25ef5fac19ec896e5dd1421db740d59bb3ff76838ded16846172d0ee5",
)


def test_every_weight_xnnpack_packs_needs_an_entry() -> None:
    from ptestore.xnnpack.cache import artifact_weights

    keys, weights = artifact_weights(FIXTURES / "mlp_xnnpack.pte")
    assert keys == set(FC1 + FC2)
    assert [(w.node, w.where, w.filter_key, w.bias_key) for w in weights] == [
        ("FullyConnected", "forward[0] xnodes[0]", *FC1),
        ("FullyConnected", "forward[0] xnodes[1]", *FC2),
    ]
    both = parse_index(xpwc([(FC2[0] + FC2[1], 0, 100, 3), (FC1[0] + FC1[1], PAGE, 100, 43)]), "f")
    check_names(both, keys, "f")
    check_coverage(both, weights, "f")
    one = parse_index(xpwc([(FC2[0] + FC2[1], 0, 100, 3)]), "f")
    check_names(one, keys, "f")  # every name is the artifact's: the missing one is not
    with pytest.raises(FormatError) as err:
        check_coverage(one, weights, "f")
    assert str(err.value) == (
        f"f: index entries (weight) = '{FC1[0]}': must be a weight with an entry (XNNPACK "
        f"packs every weight: none for this one with its bias '{FC1[1]}', FullyConnected "
        "forward[0] xnodes[0])"
    )


def test_the_packing_nodes_of_the_fixtures() -> None:
    from ptestore.xnnpack.cache import artifact_weights

    conv = [(w.node, w.where) for w in artifact_weights(FIXTURES / "conv_xnnpack.pte")[1]]
    assert conv == [
        ("Conv2d", "forward[0] xnodes[1]"),
        ("Conv2d", "forward[0] xnodes[2]"),
        ("FullyConnected", "forward[1] xnodes[0]"),
    ]
    # a weight shared by two methods is one entry for both
    two = artifact_weights(FIXTURES / "two_methods_xnnpack.pte")[1]
    assert len({w.entry_name for w in two}) == 1 and len(two) == 2
    assert artifact_weights(FIXTURES / "mlp_portable.pte") == (set(), [])


X86 = "processor\t: 0\nflags\t\t: fpu sse4_1 sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm sve\n"


def test_the_cpu_fingerprint_names_the_kernel_picking_features_only() -> None:
    x86 = cpu_fingerprint(X86, "x86_64")
    assert x86.endswith(":sse4_1,sse4_2,avx,fma,avx2,avx512f,avx512_vnni,amx_tile")
    assert x86.startswith("x86_64/page=")
    assert cpu_fingerprint(ARM, "aarch64").endswith(":asimd,asimddp,i8mm,sve")
    # one feature more or less is another fingerprint
    assert cpu_fingerprint(X86.replace(" amx_tile", ""), "x86_64") != x86


def test_the_cpu_fingerprint_names_every_isa_xnnpack_dispatches_on() -> None:
    """SSSE3, XOP and GFNI pick kernels too (GFNI: the AVX512-VNNI-GFNI ones)."""
    flags = "flags\t\t: fpu ssse3 sse4_1 avx fma xop avx2 avx512f avx512_vnni gfni\n"
    assert cpu_fingerprint(flags, "x86_64").endswith(
        ":ssse3,sse4_1,avx,fma,xop,avx2,avx512f,avx512_vnni,gfni"
    )
    for flag in ("ssse3", "xop", "gfni"):
        assert cpu_fingerprint(flags.replace(f" {flag}", ""), "x86_64") != cpu_fingerprint(
            flags, "x86_64"
        )


def test_an_arm64_fingerprint_names_its_first_cores_midr() -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    a76 = cpu_fingerprint(ARM, "aarch64", midr="0x00000000414fd0b1\n")
    assert a76 == f"aarch64/page={page}/midr=0x414fd0b1:asimd,asimddp,i8mm,sve"
    assert cpu_fingerprint(ARM, "aarch64", midr="0x00000000410fd050\n") != a76  # an A55
    # no register exposed (an older kernel, a container), or not a number: no midr
    for text in ("", "garbage\n"):
        assert cpu_fingerprint(ARM, "aarch64", midr=text) == (
            f"aarch64/page={page}:asimd,asimddp,i8mm,sve"
        )
    # x86 has none, whatever is given
    assert "midr" not in cpu_fingerprint(X86, "x86_64", midr="0x410fd4c0")


def test_a_record_of_an_earlier_fingerprint_is_another_cpus() -> None:
    """A fingerprint is compared as a string: one an earlier version wrote (no ssse3, no
    midr) names another file and another CPU, listed as such, never an error."""
    page = os.sysconf("SC_PAGE_SIZE")
    now = cpu_fingerprint(ARM, "aarch64", midr="0x410fd4c0")
    old = f"aarch64/page={page}:asimd,asimddp,i8mm,sve"
    new_id = Identity("p" * 64, None, "1.4.1+cpu", "e4d0", now)
    old_id = Identity("p" * 64, None, "1.4.1+cpu", "e4d0", old)
    assert new_id.name != old_id.name
    assert new_id.differences(old_id.to_json()) == [f"cpu: {old!r} != {now!r}"]


def test_the_identity_names_the_file_and_lists_what_differs() -> None:
    a = Identity("p" * 64, None, "1.4.1+cpu", "e4d0", "x86_64/page=4096:avx2")
    b = Identity("q" * 64, None, "1.4.1+cpu", "e4d0", "x86_64/page=4096:avx2")
    assert a.name != b.name and a.name.startswith("xnnpack-") and len(a.name) == 40
    assert a.differences(b.to_json()) == [f"pte_sha256: {'q' * 64!r} != {'p' * 64!r}"]
    assert a.differences(a.to_json()) == []


def test_no_compiler_is_one_error_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("executorch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built here yet
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(ConfigurationError) as err:
        build_shim()
    assert str(err.value) == (
        "ptestore.xnnpack builds a small native piece on first use and needs a C++17 "
        "compiler: 'no-such-compiler-xyz' is not on PATH (install g++, e.g. "
        "`apt-get install g++`, or set CXX to one)"
    )
