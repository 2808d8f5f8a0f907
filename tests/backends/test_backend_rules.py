"""Issue 19: what backend authors hit (declining, the unchanged-copy rule, registry
versions, return values, wildcards, BackendData checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.quiet_backend import Quiet

import ptestore
from ptestore.backends import (
    BackendData,
    BackendInterface,
    NotSupported,
)
from ptestore.cli import main
from ptestore.errors import BackendError, ConfigurationError, NothingSpecialized

LABEL = "support.quiet_backend:Quiet"


# -- a backend that writes nothing declines, with the backend's own reason ----------
def test_writing_nothing_is_declining(src: Path, tmp_path: Path) -> None:
    report = ptestore.specialize(src, tmp_path / "o.pte", backends=[Quiet()], allow_unchanged=True)
    (b,) = report.backends
    assert (b.status, b.inputs_seen) == ("not_supported", 1)
    assert b.reason == (
        "returned without writing anything (1 delegate inputs seen); "
        "raise NotSupported('why') to say why"
    )
    assert not report.specialized
    assert report.unchanged_reason == (
        f"every backend declined ('XnnpackBackend': {LABEL} declined: {b.reason})"
    )


def test_the_not_supported_message_is_kept(src: Path, tmp_path: Path) -> None:
    class Declines(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            raise NotSupported("needs an NPU with int4 support")

    report = ptestore.specialize(
        src, tmp_path / "o.pte", backends=[Declines()], allow_unchanged=True
    )
    assert report.backends[0].reason == "needs an NPU with int4 support"
    assert "declined: needs an NPU with int4 support" in (report.unchanged_reason or "")


def test_cli_summary_shows_why_a_backend_declined(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "o.pte"
    spec = LABEL
    assert main(["specialize", str(src), str(dst), "--backend", spec, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{LABEL} declined: returned without writing anything" in err
    assert not dst.exists()
    argv = ["specialize", str(src), str(dst), "--backend", spec, "--allow-unchanged"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        f"backend XnnpackBackend ({spec}): declined: returned without writing anything "
        "(1 delegate inputs seen); raise NotSupported('why') to say why (data kept as is)"
    ) in out


# -- one rule for Python and the CLI: nothing specialized raises, unless opted in ----
def test_specialize_refuses_an_unchanged_copy_by_default(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "o.pte"
    with pytest.raises(NothingSpecialized, match=r"^nothing was specialized in .*model\.pte"):
        ptestore.specialize(src, dst, backends=[Quiet()], provenance=False)
    assert not dst.exists()
    report = ptestore.specialize(
        src, dst, backends=[Quiet()], allow_unchanged=True, provenance=False
    )
    assert not report.specialized and dst.read_bytes() == src.read_bytes()
    # the older spelling still works
    assert not ptestore.specialize(
        src, dst, backends=[Quiet()], strict=False, provenance=False
    ).specialized


def test_strict_and_allow_unchanged_contradict(src: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"^strict=True and allow_unchanged=True contradict each other: pass one of them$",
    ):
        ptestore.specialize(src, tmp_path / "o.pte", strict=True, allow_unchanged=True)
    with pytest.raises(ConfigurationError, match=r"^allow_unchanged must be True or False, got 1$"):
        ptestore.specialize(src, tmp_path / "o.pte", allow_unchanged=1)  # type: ignore[arg-type]


def test_passthrough_is_still_a_deliberate_copy(src: Path, tmp_path: Path) -> None:
    report = ptestore.specialize(src, tmp_path / "o.pte", backends=["passthrough"])
    assert report.specialized and report.backends[0].status == "specialized"


# -- installed_backends() reports the declared version of a registered class ---------
def test_installed_backends_shows_a_registered_class_version() -> None:
    from ptestore.backends import installed_backends, register_backend, unregister_backend

    class Versioned(Quiet):
        version = "2.5.1"

    register_backend(Versioned, "issue19-versioned")
    register_backend(Versioned(), "issue19-instance")
    try:
        found = {i.name: i.version for i in installed_backends()}
    finally:
        unregister_backend("issue19-versioned")
        unregister_backend("issue19-instance")
    assert found["issue19-versioned"] == "2.5.1"
    assert found["issue19-instance"] == "2.5.1"


# -- a return value from initialize_backend_data is refused, like a generator --------
RETURNS = "backends.test_backend_rules:test_a_return_value_is_refused.<locals>.Returns"


@pytest.mark.parametrize(
    ("value", "shown"),
    [({"key": b"x"}, "dict {'key': b'x'}"), ([1, 2], "list [1, 2]"), (0, "int 0")],
)
def test_a_return_value_is_refused(src: Path, tmp_path: Path, value: object, shown: str) -> None:
    class Returns(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> Any:
            return value

    dst = tmp_path / "o.pte"
    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, dst, backends=[Returns()])
    # one way to name a backend everywhere: its id and its spec
    assert (info.value.backend, info.value.spec) == ("XnnpackBackend", RETURNS)
    assert str(info.value) == (
        f"backend 'XnnpackBackend' ({RETURNS}): initialize_backend_data returned {shown}, "
        f"not None: a "
        "return value is ignored, so nothing it holds would reach the output; submit "
        "replacements with output.write_named_data(key, BackendData(...)) and "
        "output.write_processed_data(BackendData(...)), then return None"
    )
    assert not dst.exists()


# -- no implicit wildcard -------------------------------------------------------------
def test_a_backend_without_a_name_is_refused(src: Path, tmp_path: Path) -> None:
    class Nameless(BackendInterface):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            output.write_named_data(next(iter(context.get_named_data_map())), BackendData(b""))

    label = "backends.test_backend_rules:test_a_backend_without_a_name_is_refused.<locals>.Nameless"
    dst = tmp_path / "o.pte"
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(src, dst, backends=[Nameless()])
    assert str(info.value) == (
        f"backend {label!r} has no name: set the class attribute name to the "
        "BackendDelegate.id it serves (name = 'XnnpackBackend'), or to '*' to serve every "
        f"id without a dedicated implementation (or give it as '{label}@BACKEND_ID')"
    )
    assert not dst.exists()


def test_compatibility_and_device_profile_are_in_ptestore_backends() -> None:
    from ptestore.backends import Compatibility, DeviceProfile, compat

    assert (Compatibility, DeviceProfile) == (compat.Compatibility, compat.DeviceProfile)


# -- BackendData with numpy arrays ----------------------------------------------------
def _first_float_key(named: Any) -> str:
    return next(k for k in sorted(named) if (i := named.get_tensor_info(k)) and len(i.shape) == 2)


def test_a_transposed_array_is_refused_as_not_c_contiguous(src: Path, tmp_path: Path) -> None:
    class Transposes(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            key = _first_float_key(named)
            output.write_named_data(key, BackendData(named.get_array(key).T))

    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[Transposes()])
    assert "BackendData.data is a numpy array that is not C-contiguous (shape [16, 32]" in str(
        info.value
    )
    assert "pass numpy.ascontiguousarray(array) (one copy) or array.tobytes()" in str(info.value)


def test_an_array_of_another_dtype_is_refused(src: Path, tmp_path: Path) -> None:
    import numpy as np

    class WrongDtype(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            key = _first_float_key(named)
            output.write_named_data(key, BackendData(named.get_array(key).view(np.int32)))

    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[WrongDtype()])
    message = str(info.value)
    assert "write_named_data: the replacement is a numpy array of dtype int32, the key " in message
    assert "holds float32 [32, 16], 2048 bytes" in message
    assert "convert it (array.astype(numpy.float32))" in message


def test_a_chunk_of_another_dtype_is_refused(src: Path, tmp_path: Path) -> None:
    """The same rule for pieces (write_named_data_chunks): it was not checked there."""
    import numpy as np

    class WrongDtypeChunks(Quiet):
        def initialize_backend_data(self, context: Any, output: Any) -> None:
            named = context.get_named_data_map()
            key = _first_float_key(named)
            pieces = np.array_split(named.get_array(key).view(np.int32).ravel(), 2)
            output.write_named_data_chunks(key, named.get_data_size(key), pieces)

    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[WrongDtypeChunks()])
    message = str(info.value)
    assert "write_named_data_chunks: a chunk is a numpy array of dtype int32, the key " in message
    assert "holds float32 [32, 16], 2048 bytes" in message
    assert not (tmp_path / "o.pte").exists()


def test_the_compatibility_example_in_the_docs_runs_with_and_without_a_device() -> None:
    import re

    from ptestore.backends import Compatibility, DeviceProfile

    text = (Path(__file__).resolve().parents[2] / "docs" / "backends.md").read_text()
    section = text[text.index("## Versions, compatibility") : text.index("## The report")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/backends.md", "exec"), scope)
    backend = scope["NpuBackend"]()
    sm = DeviceProfile("phone", {"soc": "sm8650"})
    assert backend.check_compatibility("compiler=7.3;soc=sm8650", sm) is Compatibility.OPTIMAL
    assert backend.check_compatibility("compiler=7.3;soc=", None) is Compatibility.OPTIMAL
    assert backend.check_compatibility("compiler=7.2;soc=sm8650", sm) is (
        Compatibility.PREFER_RESPECIALIZATION
    )
    assert backend.check_compatibility("compiler=7.3;soc=", sm) is Compatibility.UNSUPPORTED
    assert backend.version == "2.1.0"
    # Fields compared exactly: the example tested substrings, and rated a build for
    # sm8650 optimal for a device whose soc is a prefix of it, or missing, and compiler
    # 7.31 as 7.3.
    made = "compiler=7.3;soc=sm8650"
    for soc in ("sm86", "sm8", ""):
        other = DeviceProfile("phone", {"soc": soc})
        assert backend.check_compatibility(made, other) is Compatibility.UNSUPPORTED, soc
    assert backend.check_compatibility(made, DeviceProfile("phone")) is Compatibility.UNSUPPORTED
    assert backend.check_compatibility(made, None) is Compatibility.UNSUPPORTED
    assert backend.check_compatibility("compiler=7.31;soc=sm8650", sm) is (
        Compatibility.PREFER_RESPECIALIZATION
    )


# -- typo suggestions -------------------------------------------------------------------
def test_typos_in_backend_names_ids_and_import_paths_get_suggestions(
    src: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "o.pte"
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(src, dst, backends=["pasthrough"])
    assert str(info.value).startswith(
        "backend 'pasthrough': unknown name 'pasthrough' (did you mean 'passthrough'?); known: "
    )
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(src, dst, backends=["ptestore.backends.passthrough:PasthroughBackend"])
    assert str(info.value) == (
        "backend 'ptestore.backends.passthrough:PasthroughBackend': module "
        "'ptestore.backends.passthrough' has no attribute 'PasthroughBackend' (did you mean "
        "'PassthroughBackend'?)"
    )
    with pytest.raises(NothingSpecialized) as err:
        ptestore.specialize(src, dst, backends=["passthrough@XnnpackBackendd"])
    assert err.value.hint is not None
    assert err.value.hint.startswith(
        "No delegate has backend id 'XnnpackBackendd' (did you mean 'XnnpackBackend'?). "
    )
    assert not dst.exists()


def test_cli_warns_about_an_unused_backend_id_with_a_suggestion(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["specialize", str(src), str(tmp_path / "o.pte"), "--allow-unchanged", "--quiet"]
    assert main([*argv, "--backend", "passthrough@XnnpackBackendd"]) == 0
    assert (
        f"ptestore specialize: warning: no delegate in {src} has backend id 'XnnpackBackendd' "
        "(did you mean 'XnnpackBackend'?); that backend was not used"
    ) in capsys.readouterr().err
