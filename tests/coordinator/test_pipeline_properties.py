"""The whole pipeline under hostile containers x misbehaving backends x writers.

Invariants the docs promise (docs/concepts.md), checked for every drawn case:

- the source never changes;
- the destination is the old content or the complete new one (which parses and has
  the size the report says), never anything else;
- no staging file is left beside the destination, nothing is published on failure;
- the outcome matches what happened: a success returns a report, a hostile container
  raises FormatError (exit 2), a misbehaving backend BackendError (exit 1), and the CLI
  mapping gives the documented exit status;
- whatever the destination's name (drawn, with spaces, backslashes, dots and non-ASCII
  letters) and whether SIGTERM or SIGHUP arrives while a backend runs (then the run is
  interrupted like Ctrl-C: ``Terminated``, exit 130, old content, no staging);
- a destination that is a source in another spelling of its URL is refused before any
  work, the sources untouched.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures import get_fixture

import ptestore
from ptestore._signals import Terminated, termination_as_interrupt
from ptestore.backends import BackendData, BackendInterface
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, exit_code
from ptestore.errors import BackendError, ConfigurationError, FormatError, PteStoreError
from ptestore.format import parse

SOURCES = {n: get_fixture(n).main_path.read_bytes() for n in ("mlp_xnnpack", "conv_xnnpack")}
OLD = b"previous destination content"


class Misbehaving(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, how: str, sig: int | None = None) -> None:
        self.how = how
        self.sig = sig

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        if self.sig is not None:  # a service manager stops us mid-run
            os.kill(os.getpid(), self.sig)
            signal.sigtimedwait([], 0)  # let the handler run here
        named = context.get_named_data_map()
        key = sorted(named.keys())[0]
        data = bytes(named.get_data(key))
        if self.how == "double":
            output.write_named_data(key, BackendData(bytes(b ^ 0xFF for b in data)))
        elif self.how == "grow":
            output.write_named_data(key, BackendData(data + b"\0" * 4))
        elif self.how == "unknown-key":
            output.write_named_data("no-such-key", BackendData(b"x"))
        elif self.how == "twice":
            output.write_named_data(key, BackendData(data))
            output.write_named_data(key, BackendData(data))
        elif self.how == "raise":
            raise RuntimeError("device compiler crashed")
        elif self.how == "exit":
            sys.exit(0)


HOWS = ["passthrough", "double", "grow", "unknown-key", "twice", "raise", "exit"]
FAILS = {"grow", "unknown-key", "twice", "raise", "exit"}


@st.composite
def container(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A real exporter file, or one with hostile bytes in its header or FlatBuffer;
    returns the bytes and whether it is the exporter's file unchanged."""
    original = SOURCES[draw(st.sampled_from(sorted(SOURCES)))]
    data = bytearray(original)
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, min(len(data), 2048) - 1))
            data[pos] = draw(st.integers(0, 255))
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data), bytes(data) == original


def _run(src: str, dst: str, how: str, sig: int | None = None) -> ptestore.SpecializationReport:
    backends: list[Any] = (
        ["passthrough"] if how == "passthrough" and sig is None else [Misbehaving(how, sig)]
    )
    with termination_as_interrupt():
        return ptestore.specialize(src, dst, backends=backends, strict=False, provenance=False)


def _check(outcome: object, how: str, clean: bool, before: bytes, after: bytes | None) -> None:
    """``clean``: the exporter's file as it was, so the outcome is known exactly; a
    mutated file may still be accepted (then the output must be complete) or refused
    as bad input, but never leave anything but the old content behind."""
    if isinstance(outcome, Terminated):  # SIGTERM/SIGHUP during a backend: Ctrl-C's path
        assert after == before
        assert exit_code(outcome) == EXIT_INTERRUPTED
        return
    if isinstance(outcome, ptestore.SpecializationReport):
        assert how not in FAILS, (how, clean)
        assert after is not None
        assert len(after) == outcome.files[0].size_after
        parse(after, len(after), "out")  # the complete new file
        return
    assert isinstance(outcome, PteStoreError), repr(outcome)
    assert after == before  # the old content, untouched
    if clean:
        assert how in FAILS, (how, outcome)
        assert isinstance(outcome, BackendError), repr(outcome)
        assert exit_code(outcome) == EXIT_FAILURE
    elif isinstance(outcome, BackendError):
        assert exit_code(outcome) == EXIT_FAILURE
    else:  # a hostile container is bad input, refused with the error family's exit 2
        assert isinstance(outcome, (FormatError, ConfigurationError)), repr(outcome)
        assert exit_code(outcome) == EXIT_BAD_INPUT


def _attempt(src: str, dst: str, how: str, sig: int | None = None) -> object:
    try:
        return _run(src, dst, how, sig)
    except (PteStoreError, Terminated) as exc:
        return exc


#: Destination names: spaces, backslashes, dots, non-ASCII letters (never path syntax).
NAMES = st.text(
    alphabet=st.sampled_from(list("abcXYZ019 ._-\\'~+=,;@()[]!$&éü漢")), min_size=1, max_size=10
).filter(lambda n: n not in (".", "..", "in.pte"))
SIGNALS = st.sampled_from([None, None, signal.SIGTERM, signal.SIGHUP])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    drawn=container(),
    how=st.sampled_from(HOWS),
    writer=st.sampled_from(["local", "memory"]),
    name=NAMES,
    sig=SIGNALS,
)
def test_pipeline_invariants(
    tmp_path: Path, drawn: tuple[bytes, bool], how: str, writer: str, name: str, sig: int | None
) -> None:
    data, clean = drawn
    if writer == "local":
        work = tmp_path / os.urandom(6).hex()
        work.mkdir()
        src, dst = work / "in.pte", work / name
        src.write_bytes(data)
        dst.write_bytes(OLD)
        outcome = _attempt(str(src), str(dst), how, sig)
        assert src.read_bytes() == data
        after = dst.read_bytes()
        assert sorted(p.name for p in work.iterdir()) == sorted(["in.pte", name])  # no staging
    else:
        fs = fsspec.filesystem("memory")
        base = f"/props/{os.urandom(6).hex()}"
        fs.pipe_file(f"{base}/in.pte", data)  # the _file forms: a name is never a glob
        fs.pipe_file(f"{base}/{name}", OLD)
        outcome = _attempt(f"memory://{base}/in.pte", f"memory://{base}/{name}", how, sig)
        assert fs.cat_file(f"{base}/in.pte") == data
        after = fs.cat_file(f"{base}/{name}")
    _check(outcome, how, clean, OLD, after)


@pytest.mark.s3
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=container(), how=st.sampled_from(HOWS))
def test_pipeline_invariants_on_s3(moto_s3: Any, drawn: tuple[bytes, bool], how: str) -> None:
    data, clean = drawn
    bucket = moto_s3.new_bucket()
    client = moto_s3.client()
    client.put_object(Bucket=bucket, Key="in.pte", Body=data)
    client.put_object(Bucket=bucket, Key="out.pte", Body=OLD)
    backends: list[Any] = ["passthrough"] if how == "passthrough" else [Misbehaving(how)]
    try:
        outcome: object = ptestore.specialize(
            f"s3://{bucket}/in.pte",
            f"s3://{bucket}/out.pte",
            backends=backends,
            storage_options=moto_s3.storage_options,
            strict=False,
            provenance=False,
        )
    except PteStoreError as exc:
        outcome = exc
    assert client.get_object(Bucket=bucket, Key="in.pte")["Body"].read() == data
    after = client.get_object(Bucket=bucket, Key="out.pte")["Body"].read()
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    _check(outcome, how, clean, OLD, after)


EXT = get_fixture("mlp_xnnpack_ext")


@st.composite
def spelling(draw: st.DrawFn, base: str, name: str, local: bool) -> str:
    """Another spelling of ``base/name``: repeated or trailing separators, ``.`` and
    ``..`` segments, backslashes (object stores), ``file://`` (local)."""
    how = draw(st.sampled_from(["same", "double", "dot", "dotdot", "backslash", "scheme"]))
    if how == "double":
        return f"{base}//{name}"
    if how == "dot":
        return f"{base}/./{name}"
    if how == "dotdot":
        return f"{base}/x/../{name}"
    if how == "backslash" and not local:
        return f"{base}\\{name}"
    if how == "scheme" and local:
        return f"file://{base}/{name}"
    return f"{base}/{name}"


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), writer=st.sampled_from(["local", "memory"]))
def test_a_destination_spelled_as_a_source_is_refused(
    tmp_path: Path, data: st.DataObject, writer: str
) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte, ptd = EXT.pte_path.read_bytes(), EXT.ptd_path.read_bytes()
    local = writer == "local"
    if local:
        work = tmp_path / os.urandom(6).hex()
        (work / "x").mkdir(parents=True)
        base = str(work)
        (work / "in.pte").write_bytes(pte)
        (work / "in.ptd").write_bytes(ptd)
        src, src_ptd = f"{base}/in.pte", f"{base}/in.ptd"
    else:
        fs = fsspec.filesystem("memory")
        base = f"memory://props/{os.urandom(6).hex()}"
        fs.pipe(f"{base}/in.pte", pte)
        fs.pipe(f"{base}/in.ptd", ptd)
        src, src_ptd = f"{base}/in.pte", f"{base}/in.ptd"
    victim = data.draw(st.sampled_from(["in.pte", "in.ptd"]))
    alias = data.draw(spelling(base, victim, local))
    role = data.draw(st.sampled_from(["pte", "ptd"]))
    other = f"{base}/out.other"
    dst, dst_ptd = (alias, other) if role == "pte" else (other, alias)
    with pytest.raises(ConfigurationError, match=r"are the same file|in-place specialization"):
        ptestore.specialize(src, dst, ptd=(src_ptd, dst_ptd), backends=["passthrough"])
    if local:
        assert (work / "in.pte").read_bytes() == pte and (work / "in.ptd").read_bytes() == ptd
        assert sorted(p.name for p in work.iterdir()) == ["in.ptd", "in.pte", "x"]
    else:
        assert fs.cat(f"{base}/in.pte") == pte and fs.cat(f"{base}/in.ptd") == ptd
        root = base.removeprefix("memory:/")
        assert sorted(fs.ls(base, detail=False)) == [f"{root}/in.ptd", f"{root}/in.pte"]
