"""One classification of a path or URL (``split_url``/``StorageURL``) and one scheme
table (:mod:`ptestore.storage.schemes`), asked by every module that opens, keys or
refuses a URL: ``local://``, ``FILE://`` and ``file://rel`` mean the same thing to all of
them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ptestore.coordinator.targets import target_identity
from ptestore.device.keys import entry_key
from ptestore.device.layout import CacheLayout
from ptestore.errors import ConfigurationError, ObjectNotFound, StorageError
from ptestore.journal import local_path as journal_local_path
from ptestore.storage.loaders import LocalFileLoader, loader_options, open_loader
from ptestore.storage.routing import StorageOptions
from ptestore.storage.schemes import SCHEMES, scheme_of
from ptestore.storage.types import StorageURL, local_path, split_url
from ptestore.writers import LocalFileWriter, open_writer, writer_options


@pytest.mark.parametrize(
    ("url", "protocol", "path"),
    [
        ("/abs/m.pte", "file", "/abs/m.pte"),
        ("file:///abs/m.pte", "file", "/abs/m.pte"),
        ("FILE:///abs/m.pte", "file", "/abs/m.pte"),
        ("File:///abs/../abs/m.pte", "file", "/abs/../abs/m.pte"),  # '..': the kernel's
        ("local:///abs/m.pte", "file", "/abs/m.pte"),
        ("LOCAL:///abs/m.pte", "file", "/abs/m.pte"),
        ("s3://bucket/k/m.pte", "s3", "bucket/k/m.pte"),
        ("S3A://bucket/m.pte", "s3", "bucket/m.pte"),
        ("memory://x/m.pte", "memory", "/x/m.pte"),
        ("gs://bucket/m.pte", "gs", "gs://bucket/m.pte"),
    ],
)
def test_one_classification(url: str, protocol: str, path: str) -> None:
    assert split_url(url) == (protocol, path)
    u = StorageURL.of(url)
    assert (u.text, u.protocol, u.path) == (url, protocol, path)
    assert u.local is (protocol == "file")
    assert local_path(url) == (path if protocol == "file" else None)


def test_relative_paths_after_file_are_relative_like_a_plain_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file://rel/m.pte`` is ``rel/m.pte`` under the current directory (as fsspec
    reads it and as a plain path is), not ``/rel/m.pte``."""
    monkeypatch.chdir(tmp_path)
    for url in ("rel/m.pte", "file://rel/m.pte", "FILE://rel/m.pte", "local://rel/m.pte"):
        assert split_url(url) == ("file", str(tmp_path / "rel" / "m.pte")), url
    assert split_url("file://") == ("file", str(tmp_path))


def test_a_path_with_a_colon_slash_slash_inside_is_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an RFC 3986 scheme before ``://`` makes a URL."""
    monkeypatch.chdir(tmp_path)
    for text in ("dir/a://b", "1x://b", "_x://b"):
        assert split_url(text) == ("file", os.path.join(tmp_path, text)), text


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """``d/m.pte`` and ``d/real/m.pte`` (other bytes), ``d/lnk -> real/sub``: the kernel
    resolves ``d/lnk/..`` to ``d/real``, text would say ``d``."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "m.pte").write_bytes(b"top")
    (tmp_path / "real" / "m.pte").write_bytes(b"real")
    (tmp_path / "lnk").symlink_to("real/sub", target_is_directory=True)
    return tmp_path


def test_dot_dot_after_a_link_is_the_kernels(linked: Path) -> None:
    """A local path is made absolute, never normalized: ``lnk/../m.pte`` is read and
    written where the kernel resolves it, ``nonexist/../m.pte`` does not exist, a
    source ``m.pte/`` is no directory, as ``open(2)`` says of each."""
    d = linked
    assert split_url(f"{d}/lnk/../m.pte") == ("file", f"{d}/lnk/../m.pte")
    assert StorageURL.of(f"file://{d}/lnk/../m.pte").location == str(d / "real" / "m.pte")
    loader = open_loader(f"{d}/lnk/../m.pte")
    try:
        assert bytes(loader.load(0, 4)) == b"real"
    finally:
        loader.close()
    with pytest.raises(ObjectNotFound, match=rf"^{d}/nonexist/\.\./m.pte: no such file$"):
        open_loader(f"{d}/nonexist/../m.pte")
    with pytest.raises(
        StorageError, match=rf"^{d}/m.pte/: cannot open for reading: Not a directory$"
    ):
        open_loader(f"{d}/m.pte/")
    writer = open_writer(f"{d}/lnk/../o.pte")
    writer.write(b"out", 0)
    writer.publish("create")
    assert (d / "real" / "o.pte").read_bytes() == b"out" and not (d / "o.pte").exists()


def test_a_nul_in_a_name_is_refused_where_it_is_split(tmp_path: Path) -> None:
    """Every entry point splits its names by ``StorageURL.of``: a NUL byte is one
    ConfigurationError naming the value, escaped (the OS raised a bare ValueError)."""
    import ptestore

    good = tmp_path / "m.pte"
    good.write_bytes(b"x")
    for bad in (f"{tmp_path}/nul\x00.pte", "s3://b/nul\x00.pte", "memory://x/\x00"):
        message = (
            f"{bad!r}: contains a NUL byte ('\\x00', at character {bad.index(chr(0))}): "
            "no path or URL can hold one"
        )
        calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
            (open_loader, (bad,), {}),
            (open_writer, (bad,), {}),
            (ptestore.describe, (bad,), {}),
            (ptestore.verify, (bad,), {}),
            (ptestore.specialize, (bad, tmp_path / "o.pte"), {"backends": ["passthrough"]}),
            (ptestore.specialize, (good, bad), {"backends": ["passthrough"]}),
        ]
        for call, args, kwargs in calls:
            with pytest.raises(ConfigurationError) as info:
                call(*args, **kwargs)
            assert str(info.value) == message
    assert sorted(os.listdir(tmp_path)) == ["m.pte"]


def test_a_local_destination_ending_in_a_slash_is_refused(linked: Path) -> None:
    """``out.pte/`` names a directory: refused before anything is made (before, the
    trailing '/' was dropped as text and ``out.pte`` published)."""
    d = linked
    for dest in (f"{d}/out.pte/", f"file://{d}/out.pte/", f"{d}/real/"):
        with pytest.raises(ConfigurationError) as info:
            open_writer(dest)
        shown = dest.removeprefix("file://")
        assert str(info.value) == f"{shown}: names a directory (it ends in '/'), not a file"
    assert sorted(os.listdir(d)) == ["lnk", "m.pte", "real"]


def test_location_resolves_symlinks_of_local_files_only(tmp_path: Path) -> None:
    real = tmp_path / "real.pte"
    real.write_bytes(b"x")
    (tmp_path / "link.pte").symlink_to(real)
    for url in (
        tmp_path / "link.pte",
        f"FILE://{tmp_path}/link.pte",
        f"local://{tmp_path}/link.pte",
    ):
        assert StorageURL.of(url).location == str(real)
    assert StorageURL.of("S3://b/k").location == "S3://b/k"


def test_every_module_agrees_on_local_aliases(tmp_path: Path) -> None:
    """The cache, the journal, ensure's keys, the target identity and the loaders and
    writers treat every spelling of one local file alike (before, the hand-written
    checks took ``FILE://`` and ``local://`` for remote URLs)."""
    model = tmp_path / "m.pte"
    model.write_bytes(b"model")
    spellings = [str(model), f"file://{model}", f"FILE://{model}", f"local://{model}"]
    assert {CacheLayout(f"{s}.cache").root for s in spellings} == {f"{model}.cache"}
    assert {journal_local_path(s, "recover") for s in spellings} == {str(model)}
    assert len({entry_key(s, None, None, None, False) for s in spellings}) == 1
    assert {target_identity(s) for s in spellings} == {("file", str(model))}
    for s in spellings:
        loader = open_loader(s)
        try:
            assert isinstance(loader, LocalFileLoader) and loader.path == str(model)
        finally:
            loader.close()
        writer = open_writer(s)
        try:
            assert isinstance(writer, LocalFileWriter)
        finally:
            writer.discard()


def test_remote_urls_are_refused_where_only_local_files_work() -> None:
    with pytest.raises(
        ConfigurationError, match=r"cache_dir 's3://b/c': the cache is a local directory, not a URL"
    ):
        CacheLayout("s3://b/c")
    with pytest.raises(
        ConfigurationError, match=r"^memory://x/m.pte: recover works on local files only$"
    ):
        journal_local_path("memory://x/m.pte", "recover")


def test_the_scheme_table_names_loader_and_writer_by_string() -> None:
    s3 = scheme_of("s3a://b/k")
    assert s3 is SCHEMES["s3"]
    assert (s3.loader, s3.writer) == (
        "ptestore.storage.remote:FsspecLoader",
        "ptestore.writers.s3:S3Writer",
    )
    assert (s3.requires, s3.extra, s3.install_hint()) == (
        ("s3fs",),
        "s3",
        "pip install 'ptestore[s3]'",
    )
    assert scheme_of("FILE:///x").writer == "ptestore.writers.local:LocalFileWriter"
    assert scheme_of("memory://x").writer == "ptestore.writers.memory:MemoryWriter"
    other = scheme_of("gs://b/k")
    assert (other.protocol, other.writer) == ("gs", "ptestore.writers.generic:FsspecWriter")
    assert other.writer_applies_to == "gs:// (FsspecWriter)"


def test_dispatch_goes_through_the_table() -> None:
    from ptestore.writers.memory import MemoryWriter

    w = open_writer("memory://urls/m.pte")
    try:
        assert isinstance(w, MemoryWriter)
    finally:
        w.discard()
    assert writer_options("memory://x") == MemoryWriter.accepted_options("memory://x")
    assert "retry_attempts" in loader_options("memory://x")
    assert writer_options("/local/m.pte") == LocalFileWriter.accepted_options("/local/m.pte")


def test_a_missing_extra_is_one_error_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With s3fs not importable, every way into s3:// says the same thing, before
    anything is opened: the URL, the package, the extra to install."""
    monkeypatch.setitem(sys.modules, "s3fs", None)  # how Python marks a module missing
    hint = (
        r"^s3://bucket/m.pte: s3:// needs the s3fs package, which is not installed: "
        r"pip install 'ptestore\[s3\]'$"
    )
    url = "s3://bucket/m.pte"
    calls = [
        lambda: open_loader(url),
        lambda: open_writer(url),
        lambda: loader_options(url),
        lambda: writer_options(url),
        lambda: StorageOptions({"endpoint_url": "http://x"}).check([url]),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError, match=hint):
            call()


def test_another_protocol_needs_the_package_fsspecs_registry_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gs://`` is served by fsspec through gcsfs (as fsspec's ``known_implementations``
    says): missing, it is the same one error from the loader and the writer."""
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    assert scheme_of("gs://b/k").requires == ("gcsfs",)
    assert scheme_of("memory://x").requires == ()  # fsspec's own
    hint = (
        r"^GS://b/m.pte: gs:// needs the gcsfs package, which is not installed: pip install gcsfs$"
    )
    for call in (lambda: open_loader("GS://b/m.pte"), lambda: open_writer("GS://b/m.pte")):
        with pytest.raises(ConfigurationError, match=hint):
            call()
    with pytest.raises(ConfigurationError, match=r"^nosuch://b/k: cannot read protocol 'nosuch'"):
        open_loader("nosuch://b/k")
