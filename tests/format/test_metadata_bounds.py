"""What is bounded before a container's FlatBuffer is read (``format/reader.py``,
``format/header.py``): a header claiming a FlatBuffer of 2 GiB or more, or a ``.pte``
whose root table is outside its program, is a ``FormatError`` before the read (under a
1 GiB address-space limit too: never "out of memory" for a corrupt file); a FlatBuffer
past 1 GiB is read into one buffer (``_io.pread_all``), never pieces joined."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import get_fixture

from ptestore.errors import FormatError
from ptestore.format import read_container
from ptestore.format.header import MAX_FLATBUFFER, PTE_PROGRAM_SIZE_POS
from ptestore.format.header import PTE_SEGMENT_BASE_OFFSET_POS as BASE_POS
from ptestore.storage.loaders import BytesLoader, LocalFileLoader

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
ENV = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"}


def _pte() -> bytes:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    return fx.pte_path.read_bytes()


class Counting(BytesLoader):
    """A loader that counts the bytes asked for."""

    asked = 0

    def load(self, offset: int, size: int) -> memoryview:
        self.asked += size
        return super().load(offset, size)


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)  # the rest a hole: nothing on disk
    return path


def test_a_program_of_2_gib_or_more_is_refused_before_it_is_read(tmp_path: Path) -> None:
    data = bytearray(_pte())
    struct.pack_into("<Q", data, PTE_PROGRAM_SIZE_POS, MAX_FLATBUFFER + 1)
    struct.pack_into("<Q", data, BASE_POS, 0)  # no segments: nothing else bounds it
    path = _sparse(tmp_path / "big.pte", bytes(data), 3 * GiB)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from ptestore.errors import FormatError\n"
        "from ptestore.format import read_container\n"
        "from ptestore.storage.loaders import LocalFileLoader\n"
        "try:\n"
        "    read_container(LocalFileLoader(sys.argv[1]))\n"
        "except FormatError as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=ENV
    )
    assert r.stdout.strip() == (
        f"{path}: extended header program_size = {MAX_FLATBUFFER + 1}: must be <= "
        f"{MAX_FLATBUFFER} (a FlatBuffer's offsets are 32-bit: it is under 2 GiB)"
    ), r.stderr


def test_a_ptd_flatbuffer_of_2_gib_or_more_is_refused() -> None:
    from ptestore.format.header import PtdHeader

    header = PtdHeader(40, 48, MAX_FLATBUFFER + 1, MAX_FLATBUFFER + 49, 0)
    with pytest.raises(FormatError) as err:
        header.validate(3 * GiB, "x.ptd")
    assert str(err.value) == (
        f"x.ptd: FlatTensor header flatbuffer_size = {MAX_FLATBUFFER + 1}: must be <= "
        f"{MAX_FLATBUFFER} (a FlatBuffer's offsets are 32-bit: it is under 2 GiB)"
    )


def test_a_headerless_pte_of_2_gib_or_more_is_refused(tmp_path: Path) -> None:
    data = bytearray(_pte()[:8]) + bytes(56)  # ET12 without eh00: one FlatBuffer
    path = _sparse(tmp_path / "old.pte", bytes(data), 2 * GiB)
    loader = LocalFileLoader(str(path))
    with pytest.raises(FormatError) as err:
        read_container(loader)
    loader.close()
    assert str(err.value) == (
        f"{path}: file size (a .pte without an extended header is one FlatBuffer) = "
        f"{2 * GiB}: must be <= {MAX_FLATBUFFER} (a FlatBuffer's offsets are 32-bit: it is "
        "under 2 GiB)"
    )


@pytest.mark.parametrize("root", [4, 8 << 20, 62])
def test_a_root_table_outside_the_program_is_refused_before_it_is_read(root: int) -> None:
    """A header claiming the whole file (no segments) whose root offset is not in it:
    the 64 bytes of the header read, not the claimed program."""
    data = bytearray(_pte())
    size = 8 << 20
    data += bytes(size - len(data))
    struct.pack_into("<I", data, 0, root)
    struct.pack_into("<Q", data, PTE_PROGRAM_SIZE_POS, size)
    struct.pack_into("<Q", data, BASE_POS, 0)
    loader = Counting(bytes(data), "x.pte")
    with pytest.raises(FormatError) as err:
        read_container(loader)
    want = "a multiple of 4 (table alignment)" if root == 62 else f"in [8, {size - 4}]"
    assert str(err.value) == f"x.pte: Program (table position) = {root}: must be {want}"
    assert loader.asked == 64


def test_a_read_past_1_gib_takes_one_buffer_of_its_size(tmp_path: Path) -> None:
    """Under an address-space limit of what the process holds and 1.5 GiB: 1 GiB and
    4 KiB read whole (pieces joined took twice that)."""
    path = _sparse(tmp_path / "zeros", b"x", GiB + 4096)
    code = (
        "import resource, sys\n"
        "from ptestore._io import pread_all\n"
        "import os\n"
        "vm = next(int(l.split()[1]) for l in open('/proc/self/status') "
        "if l.startswith('VmSize:'))\n"
        "limit = (vm << 10) + (3 << 29)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "data = pread_all(fd, (1 << 30) + 4096, 0)\n"
        "print(len(data), data[:1], data.count(0))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=ENV
    )
    assert r.stdout.split() == [str(GiB + 4096), "bytearray(b'x')", str(GiB + 4095)], r.stderr
    os.unlink(path)
