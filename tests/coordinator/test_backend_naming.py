"""An error a backend's own code raises names that backend the documented way
(``backend 'ID' (SPEC)``, ``error.backend``/``spec``), as the errors ptestore raises do:
a ``BackendError`` the backend raised itself reached the caller naming nobody, a
``name`` property that raised escaped as a raw exception, and a ``version`` property
that raised was reported as ``compatibility_info failed`` without the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ptestore
from ptestore.backends import BackendInterface, NotSupported
from ptestore.errors import (
    BackendError,
    InvalidReplacement,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
)


class VendorFails(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:  # an input handed out: the method is known
            raise BackendError("vendor compiler failed")


class VendorRefuses(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise InvalidReplacement("its own rule", key="k0")


class NameRaises(BackendInterface):
    @property
    def name(self) -> str:  # type: ignore[override]
        raise RuntimeError("hostile")

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise AssertionError("never called")


def _label(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def test_a_backend_error_of_the_backends_own_names_it(src: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[VendorFails()])
    e = err.value
    assert (e.backend, e.spec, e.method) == ("XnnpackBackend", _label(VendorFails), "forward")
    assert str(e) == (
        f"backend 'XnnpackBackend' ({_label(VendorFails)}), method 'forward': "
        "vendor compiler failed"
    )
    assert not (tmp_path / "o.pte").exists()


def test_its_own_key_is_kept_and_its_type(src: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidReplacement) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[VendorRefuses()])
    e = err.value
    assert (e.backend, e.spec, e.key) == ("XnnpackBackend", _label(VendorRefuses), "k0")
    assert str(e) == f"backend 'XnnpackBackend' ({_label(VendorRefuses)}), key 'k0': its own rule"


def test_a_name_that_raises_is_a_backend_error(src: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[NameRaises()])
    assert err.value.backend == _label(NameRaises)
    assert str(err.value) == (
        f"backend {_label(NameRaises)!r}: reading its name failed: RuntimeError: hostile"
    )
    assert isinstance(err.value.__cause__, RuntimeError)


class VersionRaises(BackendInterface):
    name = "XnnpackBackend"

    @property
    def version(self) -> str:  # type: ignore[override]
        raise RuntimeError("no version file")

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        for _ in context:
            pass


class OtherVersionRaises(VersionRaises):
    name = "NoSuchBackendId"  # serves no id of the program: only requested


def test_a_version_that_raises_names_the_backend(src: Path, tmp_path: Path) -> None:
    """It was reported as ``compatibility_info failed``, naming the id alone."""
    with pytest.raises(BackendError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[VersionRaises()], provenance=True)
    e = err.value
    assert (e.backend, e.spec) == ("XnnpackBackend", _label(VersionRaises))
    assert str(e) == (
        f"backend 'XnnpackBackend' ({_label(VersionRaises)}): reading its version failed: "
        "RuntimeError: no version file"
    )
    assert isinstance(e.__cause__, RuntimeError)
    # A requested backend that serves no id is recorded with its version too.
    with pytest.raises(BackendError) as err:
        ptestore.specialize(
            src,
            tmp_path / "o.pte",
            backends=[VendorPasses(), OtherVersionRaises()],
            provenance=True,
            allow_unchanged=True,
        )
    assert str(err.value) == (
        f"backend {_label(OtherVersionRaises)!r}: reading its version failed: "
        "RuntimeError: no version file"
    )
    assert not (tmp_path / "o.pte").exists()


class VendorPasses(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise NotSupported("not this device")


class ReadFails(BackendInterface):
    """A read of the model's files failing inside the call (what ptestore's S3 loader
    raises for a source replaced while read, or a connection lost after its retries)."""

    name = "XnnpackBackend"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (StorageError("s3://b/m.pte: connection lost after 5 attempts"), True),
        (PreconditionFailed("s3://b/m.pte: replaced while being read"), True),
        (ObjectNotFound("s3://b/m.pte: no such object"), False),
    ],
)
def test_a_storage_error_in_the_call_stays_what_it_is(
    src: Path, tmp_path: Path, error: Exception, transient: bool
) -> None:
    """It was wrapped as a BackendError blaming the backend, which the fleet treats as
    final: a pair whose source read failed once was never run again."""
    from ptestore.fleet.retry import transient as is_transient

    with pytest.raises(StorageError) as err:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[ReadFails(error)])
    assert err.value is error and not isinstance(err.value, BackendError)
    assert is_transient(err.value) is transient
    assert not (tmp_path / "o.pte").exists()
