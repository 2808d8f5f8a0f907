"""The whole pipeline under hostile containers x misbehaving backends x writers.

Invariants the docs promise (docs/concepts.md), checked for every drawn case:

- the source never changes;
- the destination is the old content or the complete new one (which parses and has
  the size the report says), never anything else;
- no staging file is left beside the destination, nothing is published on failure;
- the outcome matches what happened: a success returns a report, a hostile container
  raises FormatError (exit 2), a misbehaving backend BackendError (exit 1), and the CLI
  mapping gives the documented exit status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.cli.exits import EXIT_BAD_INPUT, EXIT_FAILURE, exit_code
from ptestore.errors import BackendError, ConfigurationError, FormatError, PteStoreError
from ptestore.format import parse

SOURCES = {n: get_fixture(n).main_path.read_bytes() for n in ("mlp_xnnpack", "conv_xnnpack")}
OLD = b"previous destination content"


class Misbehaving(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, how: str) -> None:
        self.how = how

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
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


def _run(src: str, dst: str, how: str) -> ptestore.SpecializationReport:
    backends: list[Any] = ["passthrough"] if how == "passthrough" else [Misbehaving(how)]
    return ptestore.specialize(src, dst, backends=backends, strict=False)


def _check(outcome: object, how: str, clean: bool, before: bytes, after: bytes | None) -> None:
    """``clean``: the exporter's file as it was, so the outcome is known exactly; a
    mutated file may still be accepted (then the output must be complete) or refused
    as bad input, but never leave anything but the old content behind."""
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


def _attempt(src: str, dst: str, how: str) -> object:
    try:
        return _run(src, dst, how)
    except PteStoreError as exc:
        return exc


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=container(), how=st.sampled_from(HOWS), writer=st.sampled_from(["local", "memory"]))
def test_pipeline_invariants(
    tmp_path: Path, drawn: tuple[bytes, bool], how: str, writer: str
) -> None:
    data, clean = drawn
    if writer == "local":
        work = tmp_path / os.urandom(6).hex()
        work.mkdir()
        src, dst = work / "in.pte", work / "out.pte"
        src.write_bytes(data)
        dst.write_bytes(OLD)
        outcome = _attempt(str(src), str(dst), how)
        assert src.read_bytes() == data
        after = dst.read_bytes()
        assert sorted(p.name for p in work.iterdir()) == ["in.pte", "out.pte"]  # no staging
    else:
        fs = fsspec.filesystem("memory")
        base = f"/props/{os.urandom(6).hex()}"
        fs.pipe(f"{base}/in.pte", data)
        fs.pipe(f"{base}/out.pte", OLD)
        outcome = _attempt(f"memory://{base}/in.pte", f"memory://{base}/out.pte", how)
        assert fs.cat(f"{base}/in.pte") == data
        after = fs.cat(f"{base}/out.pte")
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
        )
    except PteStoreError as exc:
        outcome = exc
    assert client.get_object(Bucket=bucket, Key="in.pte")["Body"].read() == data
    after = client.get_object(Bucket=bucket, Key="out.pte")["Body"].read()
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    _check(outcome, how, clean, OLD, after)
