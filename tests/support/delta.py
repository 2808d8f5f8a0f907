"""Artifacts for delta-fetch tests: versions of one multi-chunk program that differ in a
few bytes of one weight (so in one 4 MiB chunk of the content, and in the trailer).

``Poke`` (SPEC ``support.delta:Poke=STAMP``) rewrites the first named value (in key
order) with 16 bytes in its middle set from ``STAMP``: same size, same layout, so two
stamps give two artifacts that differ in one chunk. ``program(dir, per_key)`` makes the
source: the real ``mlp_xnnpack`` export with each of its 4 values ``per_key`` bytes of
seeded noise (``support.large.inflate``), without a trailer; ``big_job(tmp, dest, stamp)``
a fleet job file that makes it for one device with ``Poke(stamp)``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.backends.compat import DeviceProfile
from ptestore.provenance import read_trailer
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.storage.loaders import BytesLoader
from support.large import inflated

MiB = 1 << 20


def _first_value(context: Any) -> tuple[str, Any]:
    """The first named value of a backend's ``context`` (in key order; its blobs gone
    through first): its key and its bytes."""
    for _ in context:
        pass
    named = context.get_named_data_map()
    key = sorted(named)[0]
    return key, named.get_data(key)


class Poke(BackendInterface):
    """Writes the first value with 16 bytes of its middle set from ``stamp``."""

    name = "XnnpackBackend"

    def __init__(self, stamp: str = "1") -> None:
        self.stamp = stamp
        self.version = stamp

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        key, data = _first_value(context)
        value = bytearray(data)
        mid = len(value) // 2
        value[mid : mid + 16] = hashlib.sha256(self.stamp.encode()).digest()[:16]
        output.write_named_data(key, BackendData(bytes(value)))


def program(directory: Path, per_key: int = 5 * MiB) -> Path:
    """The source: ``mlp_xnnpack`` with 4 values of ``per_key`` bytes (no trailer)."""
    path = directory / "big.pte"
    inflated(path, per_key)
    return path


def big_job(
    tmp: Path, dest: str, stamp: str = "1", extra: str = "", backend: str | None = None
) -> Path:
    """A fleet job file in ``tmp`` (``job<N>.toml``, the next free N): one device ``a``,
    one model ``m`` whose source is ``program(tmp)`` (20 MiB: six 4 MiB chunks),
    specialized by ``Poke(stamp)`` (or the SPEC ``backend``) into
    ``dest/{device}/{model}.pte``; ``extra`` is more of the job's top-level text (e.g. a
    ``[storage_options]`` table)."""
    job = tmp / f"job{len(list(tmp.glob('job*.toml')))}.toml"
    spec = backend or f"support.delta:Poke={stamp}"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\n'
        f'backends = ["{spec}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{program(tmp)}"\n[devices.a]\nsoc = "x"\n'
    )
    return job


def version(source: Path, out: Path, stamp: str) -> Path:
    """``source`` specialized by ``Poke(stamp)``, with its provenance trailer."""
    out.parent.mkdir(parents=True, exist_ok=True)
    ptestore.specialize(source, out, backends=[Poke(stamp)])
    return out


def content_chunks(path: Path) -> list[bytes]:
    """The SHA-256 of each 4 MiB chunk of ``path``'s content (before its trailer)."""
    data = path.read_bytes()
    trailer = read_trailer(BytesLoader(data))
    end = len(data) if trailer is None else trailer.content_size
    return [
        hashlib.sha256(data[i : min(i + CHUNK_SIZE, end)]).digest()
        for i in range(0, end, CHUNK_SIZE)
    ]


def differing(a: Path, b: Path) -> list[int]:
    """Indices of the content chunks in which ``a`` and ``b`` differ."""
    ca, cb = content_chunks(a), content_chunks(b)
    assert len(ca) == len(cb)
    return [i for i, (x, y) in enumerate(zip(ca, cb, strict=True)) if x != y]


def trailer_size(path: Path) -> int:
    trailer = read_trailer(BytesLoader(path.read_bytes()))
    assert trailer is not None
    return trailer.size


def flip(path: Path, offset: int, mask: int = 1) -> None:
    """Flip the bits ``mask`` (by default the lowest) of the byte at ``offset`` (the file
    keeps its inode)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


class Rewrite(BackendInterface):
    """Writes the first value with ``nbytes`` of it, from ``offset`` (default: a third
    of the way in, plus 4321 bytes: not chunk-aligned), seeded noise from ``stamp`` (a
    weight of that size replaced: same size, same layout)."""

    name = "XnnpackBackend"

    def __init__(self, stamp: str = "1", nbytes: int = 16 * MiB, offset: int | None = None):
        self.stamp, self.nbytes, self.offset = stamp, nbytes, offset
        self.version = stamp

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        import numpy as np

        key, data = _first_value(context)
        value = np.array(np.frombuffer(data, dtype=np.uint8))
        rng = np.random.default_rng(int(self.stamp))
        start = len(value) // 3 + 4321 if self.offset is None else self.offset
        end = min(len(value), start + self.nbytes)
        value[start:end] = rng.integers(0, 255, end - start, dtype=np.uint8)
        output.write_named_data(key, BackendData(value))


class Grow(BackendInterface):
    """Writes the first value (in key order) with ``extra`` bytes of seeded noise after
    its own (packed weights, a compiled blob: a replacement of another size), so that
    every segment after it moves."""

    name = "XnnpackBackend"

    def __init__(self, extra: int | str = 1 * MiB + 12345, stamp: str = "1") -> None:
        self.extra, self.stamp = int(extra), stamp  # a str from a SPEC (``Grow=EXTRA``)
        self.version = f"{stamp}+{extra}"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        import numpy as np

        key, data = _first_value(context)
        rng = np.random.default_rng(int(self.stamp))
        value = bytes(data) + rng.integers(0, 255, self.extra, dtype=np.uint8).tobytes()
        output.write_named_data(key, BackendData(value, allow_size_change=True))


def grown(source: Path, out: Path, extra: int = 1 * MiB + 12345) -> Path:
    """``source`` specialized by ``Grow(extra)``, with its provenance trailer."""
    out.parent.mkdir(parents=True, exist_ok=True)
    ptestore.specialize(source, out, backends=[Grow(extra)])
    return out


class Scale(BackendInterface):
    """Writes the first value (in key order) of a float32 program multiplied by
    ``factor`` (SPEC ``support.delta:Scale=FACTOR``): one weight changed, every value a
    finite float, so that the real runtime packs and runs it (XNNPACK's packed-weight
    file then differs in that weight's region only)."""

    name = "XnnpackBackend"

    def __init__(self, factor: str | float = "1") -> None:
        self.factor = float(factor)
        self.version = str(factor)

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        import numpy as np

        key, data = _first_value(context)
        value = np.frombuffer(data, dtype=np.float32) * np.float32(self.factor)
        output.write_named_data(key, BackendData(value.astype(np.float32).tobytes()))


#: The device of :func:`packed_job` (its options as the job declares them).
PHONE = DeviceProfile("phone", {"soc": "x"})


def packed_job(tmp: Path, source: Path, dest: str, factor: str = "1", extra: str = "") -> Path:
    """A fleet job file in ``tmp`` (``job-<factor>.toml``): the one model ``m`` from
    ``source`` (a real XNNPACK export), ``Scale(factor)``, for the device ``phone`` that
    declares this machine's CPU (``xnnpack_cpu``: the run makes its packed-weight file),
    into ``dest/{device}/{model}.pte``; ``extra`` is more of the job's top-level text."""
    from ptestore.xnnpack import cpu_fingerprint

    job = tmp / f"job-{factor}.toml"
    job.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\n'
        f'backends = ["support.delta:Scale={factor}"]\n{extra}'
        f'[[models]]\nname = "m"\nsource = "{source}"\n'
        f'[devices.phone]\nsoc = "x"\nxnnpack_cpu = "{cpu_fingerprint()}"\n'
    )
    return job


def packed_run(job: Path, capsys: Any) -> str:
    """``fleet run`` of a :func:`packed_job` (it must make the packed-weight file); the
    URL of the index it published."""
    from support.fleetrun import fleet_run_json

    capsys.readouterr()
    run = fleet_run_json(job, capsys)
    assert run["pairs"][0]["xnnpack"].startswith("XNNPACK packed-weight file made: ")
    return str(run["index"])


def two_versions(d: Path) -> tuple[Path, Path]:
    """Two versions of one program under ``d`` (``a/m.pte``, ``b/m.pte``) that differ in
    chunk 1 alone: last month's artifact and this month's."""
    src = program(d)
    a, b = version(src, d / "a" / "m.pte", "1"), version(src, d / "b" / "m.pte", "2")
    assert differing(a, b) == [1]
    return a, b
