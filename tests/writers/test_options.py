"""open_writer checks options up front: names that apply, values of the right type."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptestore.errors import ConfigurationError
from ptestore.writers import (
    FsspecWriter,
    LocalFileWriter,
    MemoryWriter,
    S3Writer,
    WriterGuarantees,
    open_writer,
)


def test_memory_refuses_unknown_options() -> None:
    """open_writer("memory://x", bogus=1) used to be accepted and ignored."""
    with pytest.raises(
        ConfigurationError,
        match=r"^memory://x: options \['bogus'\] do not apply to memory:// \(accepted: \['fs'\]\)$",
    ):
        open_writer("memory://x", bogus=1)


def test_local_checks_types(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"m\.pte: option durable = 'yes': must be a bool"):
        open_writer(tmp_path / "m.pte", durable="yes")


def test_generic_refuses_options_its_filesystem_does_not_take(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"dir://d/m\.pte: options \['bogus'\] do not apply to dir:// \(FsspecWriter\) "
        r"\(accepted: \[.*'path', .*'retry_attempts', .*'spool_dir', .*'target_protocol'",
    ):
        open_writer("dir://d/m.pte", path=str(tmp_path), target_protocol="file", bogus=1)
    with pytest.raises(ConfigurationError, match=r"option spool_dir = 5: must be a str or path"):
        open_writer("dir://d/m.pte", path=str(tmp_path), spool_dir=5)


def test_s3_checks_options_before_connecting() -> None:
    with pytest.raises(ConfigurationError, match=r"option client_kwargs = \[1\]: must be a dict"):
        open_writer("s3://bucket/k.pte", client_kwargs=[1])
    with pytest.raises(ConfigurationError, match=r"option retry_attempts = 'x': must be an int"):
        open_writer("s3://bucket/k.pte", retry_attempts="x")


@pytest.mark.parametrize(
    ("cls", "atomic", "exclusive", "durable", "verified", "cas"),
    [
        (LocalFileWriter, True, True, True, False, True),
        (MemoryWriter, True, True, False, False, True),
        (S3Writer, True, True, True, True, True),
        (FsspecWriter, False, False, False, False, False),
    ],
)
def test_guarantees_are_data_on_the_class(
    cls: type, atomic: bool, exclusive: bool, durable: bool, verified: bool, cas: bool
) -> None:
    """docs/storage.md's table states the same."""
    g = cls.guarantees
    assert isinstance(g, WriterGuarantees)
    assert (
        g.atomic_publish,
        g.exclusive_create,
        g.durable,
        g.verified,
        g.isolated,
        g.conditional_update,
    ) == (atomic, exclusive, durable, verified, True, cas)
