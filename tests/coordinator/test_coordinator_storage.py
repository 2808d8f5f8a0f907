"""The coordinator against real storage: S3 (moto, SeaweedFS), pairs, changing sources."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import fsspec
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import BackendData, BackendInterface
from ptestore.cli import main
from ptestore.errors import (
    AlreadyExists,
    BackendError,
    ConfigurationError,
    PartialPublish,
    StorageError,
)
from ptestore.format import parse
from ptestore.storage.loaders import open_loader
from ptestore.testing.moto import small_s3_parts
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import open_writer

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
assert MLP.pte_path is not None
MLP_KEYS = [e["key"] for e in MLP.facts["pte"]["named_data"]]


class Raising(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, what: str) -> None:
        self.what = what

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass
        if self.what == "raise":
            raise RuntimeError("device compiler crashed")
        output.write_named_data("no-such-key", BackendData(b"x"))


@pytest.mark.s3
@pytest.mark.parametrize("what", ["raise", "unknown-key"])
def test_failures_leave_nothing_on_s3(s3_server: S3TestServer, what: str) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    assert MLP.pte_path is not None
    client.put_object(Bucket=bucket, Key="in.pte", Body=MLP.pte_path.read_bytes())
    client.put_object(Bucket=bucket, Key="out.pte", Body=b"previous")
    with pytest.raises(BackendError):
        ptestore.specialize(
            f"s3://{bucket}/in.pte",
            f"s3://{bucket}/out.pte",
            backends=[Raising(what)],
            storage_options=s3_server.storage_options,
        )
    assert client.get_object(Bucket=bucket, Key="out.pte")["Body"].read() == b"previous"
    assert client.get_object(Bucket=bucket, Key="in.pte")["Body"].read() == (
        MLP.pte_path.read_bytes()
    )
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


class HeldParts:
    """Wraps a real S3Writer and records how many parts it buffers before the
    metadata (written last) arrives."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.held_before_metadata: list[int] | None = None

    def write(self, data: Any, offset: int) -> None:
        if offset == 0:
            parts = self.inner.parts.items()
            self.held_before_metadata = sorted(i for i, p in parts if p.buf is not None)
        self.inner.write(data, offset)

    def copy_from(self, loader: Any, src_offset: int, size: int, dst_offset: int) -> None:
        self.inner.copy_from(loader, src_offset, size, dst_offset)

    def publish(self, mode: str = "overwrite") -> Any:
        return self.inner.publish(mode)

    def discard(self) -> None:
        self.inner.discard()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # the rest of the DataWriter interface


@pytest.mark.s3
@pytest.mark.parametrize("name", ["mlp_xnnpack_align4096", "conv_xnnpack", "mlp_xnnpack"])
def test_s3_parts_with_alignment_gaps_are_not_held(s3_server: S3TestServer, name: str) -> None:
    """Padding is written as zeros, so parts holding gaps upload as soon as they are
    complete: before the metadata (written last) arrives, only the parts overlapping
    the metadata and the final, short part are still in memory."""
    fx = get_fixture(name)
    assert fx.pte_path is not None
    bucket = s3_server.new_bucket()
    part = max(512, s3_server.min_part_size)  # real S3: 5 MiB, so one part here
    data = fx.pte_path.read_bytes()
    meta_size = parse(data, len(data), "m").metadata_size
    with small_s3_parts():  # the fixtures are far smaller than S3's 5 MiB parts
        inner = open_writer(
            f"s3://{bucket}/out.pte", part_size=part, max_concurrency=1, **s3_server.storage_options
        )
    writer = HeldParts(inner)
    with open_loader(fx.pte_path) as loader:
        ptestore.initialize_and_save_backend_data(
            loader, writer, backends=["passthrough"], provenance=False
        )
    nparts = math.ceil(len(data) / part)
    allowed = set(range(math.ceil(meta_size / part) + 1)) | {nparts - 1}
    assert writer.held_before_metadata is not None
    assert set(writer.held_before_metadata) <= allowed
    body = s3_server.client().get_object(Bucket=bucket, Key="out.pte")["Body"].read()
    assert body == data


def test_create_mode_checks_every_destination_first(tmp_path: Path) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    (tmp_path / "o.pte").write_bytes(b"existing")
    with pytest.raises(AlreadyExists, match=r"o\.pte: already exists \(create mode"):
        ptestore.specialize(
            EXT.pte_path,
            tmp_path / "o.pte",
            ptd=(EXT.ptd_path, tmp_path / "o.ptd"),
            backends=["passthrough"],
            mode="create",
        )
    assert not (tmp_path / "o.ptd").exists()  # nothing of the pair was published


@pytest.mark.parametrize("mode", ["create", "overwrite"])
def test_a_misspelt_destination_option_names_the_writers_options(tmp_path: Path, mode: Any) -> None:
    """Refused before any work, naming what the local writer takes; in create mode the
    probe (a read) refused it first, naming the reader's options: ``accepted: []``."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    out = tmp_path / "o.pte"
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(
            EXT.pte_path,
            out,
            ptd=(EXT.ptd_path, tmp_path / "o.ptd"),
            backends=["passthrough"],
            mode=mode,
            allow_unchanged=True,
            dst_storage_options={"auto_mkdri": True},
        )
    assert str(info.value) == (
        f"{out}: options ['auto_mkdri'] do not apply to local files "
        "(accepted: ['auto_mkdir', 'durable'])"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_partial_publish_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """If the .pte publish fails after the .ptd was published (a racing writer), the
    error says so instead of claiming nothing was published."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte_out, ptd_out = tmp_path / "o.pte", tmp_path / "o.ptd"

    class Racing:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.url = inner.url

        def write(self, data: Any, offset: int) -> None:
            self.inner.write(data, offset)

        def copy_from(self, *args: Any) -> None:
            self.inner.copy_from(*args)

        def publish(self, mode: str = "overwrite") -> Any:
            pte_out.write_bytes(b"someone else won")  # the race, just before our publish
            return self.inner.publish(mode)

        def discard(self) -> None:
            self.inner.discard()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)  # the rest of the DataWriter interface

    a, b = open_loader(EXT.pte_path), open_loader(EXT.ptd_path)
    with pytest.raises(PartialPublish) as info:
        ptestore.initialize_and_save_backend_data(
            a,
            Racing(open_writer(pte_out)),
            ptd_loader=b,
            ptd_writer=open_writer(ptd_out),
            backends=["passthrough"],
            mode="create",
            provenance=False,
        )
    a.close()
    b.close()
    assert info.value.published == (str(ptd_out),)
    assert str(info.value).startswith(f"{ptd_out} was published, but publishing {pte_out} failed")
    assert pte_out.read_bytes() == b"someone else won"
    assert ptd_out.read_bytes() == EXT.ptd_path.read_bytes()


@pytest.mark.parametrize("error", [RuntimeError("progress callback failed"), KeyboardInterrupt()])
def test_a_failure_after_the_ptd_publish_is_a_partial_publish(
    tmp_path: Path, error: BaseException
) -> None:
    """An event tracer (or the CLI's progress printer on a broken pipe, or Ctrl-C)
    failing on the .ptd's publish event, before the .pte is published: the caller is
    told the .ptd was published, never "nothing published"."""
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    pte_out, ptd_out = tmp_path / "a.pte", tmp_path / "a.ptd"

    def tracer(event: Any) -> None:
        if event.kind == "publish" and event.url == str(ptd_out):
            raise error

    with pytest.raises(PartialPublish) as info:
        ptestore.specialize(
            EXT.pte_path,
            pte_out,
            ptd=(EXT.ptd_path, ptd_out),
            backends=["passthrough@XnnpackBackend"],
            allow_unchanged=True,
            event_tracer=tracer,
        )
    assert info.value.published == (str(ptd_out),)
    assert str(info.value) == (
        f"{ptd_out} was published, then the run failed before publishing {pte_out}: "
        f"{error or type(error).__name__}; rerun from the original sources"
    )
    assert info.value.__cause__ is error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ptd"]


def test_source_modified_while_reading_is_refused(tmp_path: Path) -> None:
    assert MLP.pte_path is not None
    src = tmp_path / "in.pte"
    src.write_bytes(MLP.pte_path.read_bytes())

    class Modifier(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            with src.open("ab") as f:  # someone appends to the source mid-run
                f.write(b"tail")

    with pytest.raises(StorageError, match=r"in\.pte: modified while being read"):
        ptestore.specialize(src, tmp_path / "out.pte", backends=[Modifier()], allow_unchanged=True)
    assert not (tmp_path / "out.pte").exists()


def test_remote_source_replaced_while_reading_is_refused() -> None:
    assert MLP.pte_path is not None
    fs = fsspec.filesystem("memory")
    fs.pipe("/changing/in.pte", MLP.pte_path.read_bytes())

    class Replacer(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            fs.pipe("/changing/in.pte", MLP.pte_path.read_bytes() + b"v2")  # type: ignore[union-attr]

    with pytest.raises(StorageError, match=r"replaced while being read"):
        ptestore.specialize(
            "memory://changing/in.pte",
            "memory://changing/out.pte",
            backends=[Replacer()],
            allow_unchanged=True,
        )
    assert not fs.exists("/changing/out.pte")


def test_output_with_only_empty_segments_is_valid(tmp_path: Path) -> None:
    assert MLP.pte_path is not None

    class Empty(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> None:
            context.next_backend_data()
            output.write_processed_data(BackendData(b""))
            output.write_named_data({k: BackendData(b"", allow_size_change=True) for k in MLP_KEYS})

    report = ptestore.specialize(
        MLP.pte_path, tmp_path / "o.pte", backends=[Empty()], provenance=False
    )
    data = (tmp_path / "o.pte").read_bytes()
    assert report.files[0].size_after == len(data)
    c = parse(data, len(data), "o.pte")
    assert all(s.size == 0 for s in c.segments)


def test_cli_names_the_real_backend_id_and_warns_about_unused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MLP.pte_path is not None
    dst = tmp_path / "o.pte"
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", "command=false"]) == 1
    assert capsys.readouterr().err == (
        "ptestore specialize: failed, nothing published: backend 'XnnpackBackend' "
        "(command=false), method 'forward': command 'false' exited with status 1 on a "
        "delegate blob\n"
    )
    spec = "passthrough@XNNPACKBackend"
    # A typo'd id serves nothing: nothing specialized, exit 2 (issue 8, item 4) ...
    assert main(["specialize", str(MLP.pte_path), str(dst), "--backend", spec, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the backends given serve no backend id of the program: " in err
    assert "passthrough@XNNPACKBackend (serves 'XNNPACKBackend')" in err
    # ... unless an unchanged copy is accepted; the typo is still reported.
    args = ["--backend", spec, "--quiet", "--allow-unchanged"]
    assert main(["specialize", str(MLP.pte_path), str(dst), *args]) == 0
    err = capsys.readouterr().err
    assert "no delegate in" in err
    assert "'XNNPACKBackend'" in err


def test_cli_storage_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert MLP.pte_path is not None
    args = ["specialize", str(MLP.pte_path), str(tmp_path / "o.pte"), "--backend", "passthrough"]
    assert main([*args, "--spool-dir", str(tmp_path / "missing")]) == 1
    assert "cannot create the replacement spool in" in capsys.readouterr().err


@pytest.mark.s3
def test_common_writer_options_reach_writers_only(s3_server: S3TestServer) -> None:
    """``part_size`` in the shared options is a writer option: the S3 source loader
    must not get it (it would refuse it), the S3 writer must."""
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    assert MLP.pte_path is not None
    client.put_object(Bucket=bucket, Key="in.pte", Body=MLP.pte_path.read_bytes())
    report = ptestore.specialize(
        f"s3://{bucket}/in.pte",
        f"s3://{bucket}/out.pte",
        backends=["passthrough"],
        storage_options={**s3_server.storage_options, "part_size": 5 << 20},
        provenance=False,
    )
    assert report.files[0].size_after == len(MLP.pte_path.read_bytes())
    body = client.get_object(Bucket=bucket, Key="out.pte")["Body"].read()
    assert body == MLP.pte_path.read_bytes()


def test_common_options_that_apply_nowhere_are_refused() -> None:
    fs = fsspec.filesystem("memory")
    assert MLP.pte_path is not None
    fs.pipe("/opts/in.pte", MLP.pte_path.read_bytes())
    with pytest.raises(ptestore.ConfigurationError) as info:
        ptestore.specialize(
            "memory://opts/in.pte",
            "memory://opts/out.pte",
            backends=["passthrough"],
            storage_options={"bogus": 1},
        )
    assert str(info.value).startswith(
        "storage options ['bogus'] apply to none of memory://opts/in.pte, memory://opts/out.pte "
        "(accepted: ["
    )
    assert not fs.exists("/opts/out.pte")
