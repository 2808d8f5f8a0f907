"""Meta-tests of the backend kit (``ptestore.testing.BackendContract``): the kit run over
wrong backends fails each one, by the check meant to catch it, and disabling any one of
the kit's checks makes a test here fail.

The wrong backends: one that does nothing, a one-word typo that makes it decline
everywhere, one that declines everywhere saying why (passes only with
``declines_on_purpose``), nondeterministic, not idempotent, one that changes what the
model computes, one that writes non-finite weights, one that zeroes the weights or
writes nan only when it gets no device (the kit looked at that run only to rate it), one
that rates its own build unsupported, an output that lost a key (what a broken writer
would give: a backend cannot drop keys through the API, so the kit's key check guards
ptestore itself), a
version that differs on each read and one that changes during the call (the SDK it
names loaded by ``initialize_backend_data``): both made artifacts stale at once and
passed the kit.

A run that fails shows the backend's own traceback (its file and line), which the kit
hid (``pytest.fail(..., pytrace=False)`` with ptestore's message alone)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from support.quiet_backend import Quiet as DoesNothing

from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
)
from ptestore.backends.compat import Compatibility, DeviceProfile
from ptestore.errors import NotSupported
from ptestore.testing import BackendContract, Program, shipped_program
from ptestore.testing.backend_contract import Outcome

PROGRAMS = [shipped_program("mlp_xnnpack"), shipped_program("mlp_xnnpack_ext")]

#: Every check of the kit (a new one needs a wrong backend below that only it catches).
CHECKS = sorted(n for n in vars(BackendContract) if n.startswith("test_"))


def _floats(context: BackendDataInitContext) -> Iterator[tuple[str, np.ndarray]]:
    """Every float32 named value of the model, as a writable copy."""
    for _ in context:
        pass
    named = context.get_named_data_map()
    for key in named:
        info = named.get_tensor_info(key)
        if info is not None and info.dtype == "float32":
            yield key, np.frombuffer(bytes(named.get_data(key)), dtype=np.float32).copy()


class _Rewrite(BackendInterface):
    """A backend that rewrites every float32 weight with :meth:`change`."""

    name = "XnnpackBackend"
    version = "1.0"

    def change(self, values: np.ndarray) -> np.ndarray:
        return values  # the same bytes: a correct (if useless) backend

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for key, values in _floats(context):
            output.write_named_data(key, BackendData(self.change(values).tobytes()))


class Typo(_Rewrite):
    """Meant to double every float32 weight; a typo in the dtype makes it decline
    everywhere without a word."""

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        named = context.get_named_data_map()
        for _ in context:
            pass
        for key in named:
            info = named.get_tensor_info(key)
            if info is not None and info.dtype == "flaot32":
                raw = np.frombuffer(bytes(named.get_data(key)), dtype=np.float32)
                output.write_named_data(key, BackendData((raw * 2).tobytes()))


class DeclinesSayingWhy(BackendInterface):
    name = "XnnpackBackend"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        raise NotSupported("this backend only packs int4 weights")


class Nondeterministic(_Rewrite):
    """Each call moves another weight by one unit in the last place: the bytes differ
    from run to run (and a second run changes them again), the runtime's outputs stay
    within tolerance. (Random noise of 1e-6 made the outputs leave it now and then, so
    the runtime check failed it too: a flaky meta-test.)"""

    calls = 0

    def change(self, values: np.ndarray) -> np.ndarray:
        Nondeterministic.calls += 1
        out = values.astype(np.float32).copy()
        flat = out.reshape(-1)
        i = Nondeterministic.calls % flat.size
        flat[i] = np.nextafter(flat[i], np.float32(np.inf), dtype=np.float32)
        return out


class NotIdempotent(_Rewrite):
    def change(self, values: np.ndarray) -> np.ndarray:
        return values * np.float32(1.5)


class ChangesOutputs(_Rewrite):
    """Idempotent and deterministic, but the model computes something else."""

    def change(self, values: np.ndarray) -> np.ndarray:
        return np.full_like(values, 0.5)


class NonFinite(_Rewrite):
    def change(self, values: np.ndarray) -> np.ndarray:
        return np.full_like(values, np.nan)


class ZeroesWithoutDevice(_Rewrite):
    """Correct for a device; given none (``context.device`` None) it zeroes every float32
    weight: finite, the same sizes and keys, a stable rating. The kit looked at the run
    without a device only to rate it, and passed this backend."""

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for key, values in _floats(context):
            if context.device is None:
                values = np.zeros_like(values)
            output.write_named_data(key, BackendData(values.tobytes()))


class NonFiniteWithoutDevice(_Rewrite):
    """Writes nan weights when it gets no device."""

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for key, values in _floats(context):
            if context.device is None:
                values = np.full_like(values, np.nan)
            output.write_named_data(key, BackendData(values.tobytes()))


class RatesItsOwnBuildUnsupported(_Rewrite):
    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        return Compatibility.UNSUPPORTED


class VersionChanges(_Rewrite):
    """A version that differs on each read (an SDK queried anew, a clock)."""

    reads = 0

    @property
    def version(self) -> str:  # type: ignore[override]
        self.reads += 1
        return f"1.{self.reads}"


class LazyVersion(_Rewrite):
    """``"sdk-unknown"`` until ``initialize_backend_data`` loads the SDK it names."""

    sdk: str | None = None

    @property
    def version(self) -> str:  # type: ignore[override]
        return self.sdk or "sdk-unknown"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        self.sdk = "sdk-2.0"
        super().initialize_backend_data(context, output)


class Raises(_Rewrite):
    def change(self, values: np.ndarray) -> np.ndarray:
        return deep_inside_the_backend(values)


def deep_inside_the_backend(values: np.ndarray) -> np.ndarray:
    raise ZeroDivisionError("the backend's own error")  # RAISES


class RefusedWrite(_Rewrite):
    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        output.write_named_data("no such key", BackendData(b"x"))  # REFUSED


class _Kit(BackendContract):
    backend: ClassVar[type[BackendInterface]] = _Rewrite

    def make_backend(self) -> BackendInterface:
        return self.backend()

    def contract_programs(self) -> list[Program]:
        return PROGRAMS


def _kit(backend: type[BackendInterface], **attrs: Any) -> type[BackendContract]:
    return type(f"Kit{backend.__name__}", (_Kit,), {"backend": backend, **attrs})


class _LostKey(_Kit):
    """A correct backend whose output then lost a key (renamed in the metadata)."""

    def _run(self, program: Program, run: str, *args: Any, **kwargs: Any) -> Outcome:
        outcome = super()._run(program, run, *args, **kwargs)
        if run == "first" and outcome.error is None and not getattr(outcome, "lost", False):
            with program_named(program) as named:
                key = sorted(named.keys())[0].encode()
            gone = key[:-1] + (b"0" if key[-1:] != b"0" else b"1")
            if outcome.ptd is not None and key in outcome.ptd:
                outcome.ptd = outcome.ptd.replace(key, gone, 1)
            else:
                outcome.pte = outcome.pte.replace(key, gone, 1)
            outcome.lost = True  # type: ignore[attr-defined]
        return outcome


def program_named(program: Program) -> Any:
    from ptestore.testing import open_named_data

    return open_named_data(program.pte, program.ptd)


#: wrong backend -> the checks that must fail it (exactly those).
WRONG: dict[str, tuple[type[BackendContract], set[str]]] = {
    "does-nothing": (
        _kit(DoesNothing),
        {"test_runs_or_declines", "test_specializes_something"},
    ),
    "typo": (_kit(Typo), {"test_runs_or_declines", "test_specializes_something"}),
    "declines-saying-why": (_kit(DeclinesSayingWhy), {"test_specializes_something"}),
    "nondeterministic": (
        _kit(Nondeterministic),
        {"test_deterministic", "test_second_run_changes_nothing"},
    ),
    "not-idempotent": (
        _kit(NotIdempotent),
        {"test_second_run_changes_nothing", "test_loads_in_runtime"},
    ),
    "changes-outputs": (_kit(ChangesOutputs), {"test_loads_in_runtime"}),
    "non-finite": (
        _kit(NonFinite),
        {"test_replacements_match_tensor_info", "test_loads_in_runtime"},
    ),
    "zeroes-without-device": (_kit(ZeroesWithoutDevice), {"test_loads_in_runtime"}),
    "non-finite-without-device": (
        _kit(NonFiniteWithoutDevice),
        {"test_replacements_match_tensor_info", "test_loads_in_runtime"},
    ),
    "rates-own-build-unsupported": (
        _kit(RatesItsOwnBuildUnsupported),
        {"test_compatibility_round_trip"},
    ),
    "version-changes": (_kit(VersionChanges), {"test_records_a_stable_version"}),
    "lazy-version": (_kit(LazyVersion), {"test_records_a_stable_version"}),
    "lost-key": (
        _LostKey,
        {
            "test_deterministic",  # the other runs' outputs kept it
            "test_keeps_keys_and_shared_bytes",
            "test_replacements_match_tensor_info",
            "test_loads_in_runtime",
            # specializing the output again: a .ptd without a key its .pte reads is refused
            "test_second_run_changes_nothing",
        },
    ),
}


#: The checks run on the run with the kit's device and on the one without.
BOTH_RUNS = {
    "test_compatibility_round_trip",
    "test_keeps_keys_and_shared_bytes",
    "test_loads_in_runtime",
    "test_replacements_match_tensor_info",
}


def _calls(check: str) -> list[dict[str, Any]]:
    if check == "test_specializes_something":
        return [{}]
    if check in BOTH_RUNS:
        return [{"program": p, "with_device": d} for p in PROGRAMS for d in (True, False)]
    return [{"program": p} for p in PROGRAMS]


def failures(kit: type[BackendContract], check: str) -> list[str]:
    """What ``check`` of ``kit`` says over the programs (empty: it passed)."""
    out = []
    for kwargs in _calls(check):
        try:
            getattr(kit(), check)(**kwargs)
        except (Exception, pytest.fail.Exception) as exc:  # an error fails a check too
            out.append(str(exc) if isinstance(exc, AssertionError) else repr(exc))
    return out


def failing_checks(kit: type[BackendContract]) -> set[str]:
    return {c for c in CHECKS if failures(kit, c)}


def test_the_checks_of_the_kit_are_the_ones_meta_tested() -> None:
    assert CHECKS == [
        "test_compatibility_round_trip",
        "test_deterministic",
        "test_keeps_keys_and_shared_bytes",
        "test_loads_in_runtime",
        "test_records_a_stable_version",
        "test_replacements_match_tensor_info",
        "test_runs_or_declines",
        "test_second_run_changes_nothing",
        "test_specializes_something",
    ]
    caught = set().union(*(want for _, want in WRONG.values()))
    assert caught == set(CHECKS), (
        f"no wrong backend shows these checks work: {set(CHECKS) - caught}"
    )


def test_a_correct_backend_and_one_that_declines_on_purpose_pass() -> None:
    assert failing_checks(_kit(_Rewrite)) == set()
    assert failing_checks(_kit(DeclinesSayingWhy, declines_on_purpose=True)) == set()


@pytest.mark.parametrize("name", sorted(WRONG))
def test_the_kit_fails_each_wrong_backend(name: str) -> None:
    kit, want = WRONG[name]
    assert failing_checks(kit) == want


def test_what_the_kit_says() -> None:
    silent = failures(WRONG["does-nothing"][0], "test_runs_or_declines")
    assert silent and all(
        "backend 'XnnpackBackend' declined without saying why (raise NotSupported('why'))" in m
        for m in silent
    )
    (everywhere,) = failures(WRONG["declines-saying-why"][0], "test_specializes_something")
    assert everywhere == (
        "the backend replaced nothing in any program of the kit (mlp_xnnpack: XnnpackBackend: "
        "not_supported (this backend only packs int4 weights) | mlp_xnnpack_ext: "
        "XnnpackBackend: not_supported (this backend only packs int4 weights)); if it "
        "declines everything on purpose, set declines_on_purpose = True"
    )
    (typo, _) = failures(WRONG["typo"][0], "test_runs_or_declines")
    assert "declined without saying why" in typo
    assert any(
        "two runs with fresh backend instances gave different bytes" in m
        for m in failures(WRONG["nondeterministic"][0], "test_deterministic")
    )
    assert any(
        "specializing the output again changed it" in m
        for m in failures(WRONG["not-idempotent"][0], "test_second_run_changes_nothing")
    )
    # (the kit's asserts are rewritten: pytest adds the comparison after the message)
    changes = failures(WRONG["version-changes"][0], "test_records_a_stable_version")
    assert len(changes) == len(PROGRAMS) and all(
        m.startswith(
            "the backend's version changed between two reads of one fresh instance ('1.1', "
            "then '1.2'): make version one value per instance (a class attribute, or "
            "computed once in __init__)"
        )
        for m in changes
    ), changes
    lazy = failures(WRONG["lazy-version"][0], "test_records_a_stable_version")
    assert [m.split("\n")[0] for m in lazy] == [
        f"{p.name}: the backend's version changed during its run ('sdk-unknown' when the "
        "run read it, before initialize_backend_data; 'sdk-2.0' after): compute it in "
        "__init__ (load what it names there), not in initialize_backend_data"
        for p in PROGRAMS
    ], lazy
    lost = failures(_LostKey, "test_keeps_keys_and_shared_bytes")
    assert len(lost) == 2
    assert all(": the output's keys are not the source's: missing ['" in m for m in lost)


@pytest.mark.parametrize("check", CHECKS)
def test_disabling_a_check_is_noticed(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, (kit, _) = next((n, w) for n, w in sorted(WRONG.items()) if check in w[1])
    assert failures(kit, check)  # the check, as shipped, fails this wrong backend
    monkeypatch.setattr(BackendContract, check, lambda self, *a, **k: None)
    with pytest.raises(AssertionError):
        test_the_kit_fails_each_wrong_backend(name)


def _line(marker: str) -> int:
    """The line of this file that holds ``marker`` (in a comment)."""
    lines = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


@pytest.mark.parametrize(
    ("backend", "marker", "where"),
    [
        (Raises, "RAISES", "in deep_inside_the_backend"),
        (RefusedWrite, "REFUSED", "in initialize_backend_data"),
    ],
    ids=["raises", "refused-write"],
)
def test_a_failed_run_shows_the_backends_own_traceback(
    backend: type[BackendInterface], marker: str, where: str
) -> None:
    """Its file and line: the kit showed ptestore's message alone."""
    kit = _kit(backend)
    here = f'File "{__file__}", line {_line(marker)}, {where}'
    for check in ("test_runs_or_declines", "test_deterministic"):
        said = failures(kit, check)
        assert said and all(here in m for m in said), said
    (first, *_) = failures(kit, "test_runs_or_declines")
    if backend is Raises:
        assert "ZeroDivisionError: the backend's own error" in first
        assert "The backend's exception:\nTraceback (most recent call last):" in first
    else:
        assert "InvalidReplacement: backend 'XnnpackBackend'" in first
        assert "Where the backend made the call:\n" in first


def test_what_the_kit_says_of_the_run_without_a_device() -> None:
    zeroes = failures(WRONG["zeroes-without-device"][0], "test_loads_in_runtime")
    assert [m.split(": method ")[0] for m in zeroes] == [
        f"{p.name} (made without a device)" for p in PROGRAMS
    ], zeroes
    assert all("max abs difference" in m for m in zeroes), zeroes
    nan = failures(WRONG["non-finite-without-device"][0], "test_replacements_match_tensor_info")
    assert len(nan) == len(PROGRAMS) and all(
        m.split("\n")[0].endswith(
            "(float32) holds non-finite values after specialization without a device: wrong "
            "dtype or layout?"
        )
        for m in nan
    ), nan


def test_a_bfloat16_value_is_finite_by_its_exponent_bits(tmp_path: Path) -> None:
    """``get_array`` gives bfloat16 as uint16 bit patterns, which ``numpy.isfinite``
    always calls finite: the kit passed a backend writing nan or inf there. A source
    ``.ptd`` whose layout says bfloat16 (none of the shipped programs has one), and an
    output where the backend wrote a nan, an infinity and a negative infinity."""
    import struct

    import flatbuffers
    from support.synth import finish_program, flat_tensor, offsets_vector

    from ptestore.coordinator.report import BackendReport, SpecializationReport
    from ptestore.testing.contract_outcomes import all_finite

    b = flatbuffers.Builder(0)
    pte = finish_program(b, offsets_vector(b, []))  # no method: the key is the .ptd's
    bf16 = (15, [4], [0])  # ScalarType BFloat16, shape [4]

    def ptd(*bits: int) -> bytes:
        return flat_tensor([("w", bf16)], struct.pack("<4H", *bits))

    (tmp_path / "m.pte").write_bytes(pte)
    (tmp_path / "m.ptd").write_bytes(ptd(0x3F80, 0x4000, 0xBF80, 0x0000))  # 1, 2, -1, 0
    program = Program("bf16", "", tmp_path / "m.pte", tmp_path / "m.ptd", (), (), {}, {}, 0.0, 0.0)
    wrote = ptd(0x3F80, 0x7FC0, 0x7F80, 0xFF80)  # 1, nan, inf, -inf
    assert bool(np.isfinite(np.frombuffer(wrote[-8:], np.uint16)).all())  # what it asked

    class Bf16Kit(_Kit):
        def _run(self, program: Program, run: str, *args: Any, **kwargs: Any) -> Outcome:
            report = BackendReport("XnnpackBackend", "x", "specialized", keys_replaced=["w"])
            return Outcome(SpecializationReport([report], [], 0.0), pte=pte, ptd=wrote)

    with pytest.raises(AssertionError) as err:
        Bf16Kit().test_replacements_match_tensor_info(program, True)
    assert str(err.value).startswith(
        "bf16: key 'w' (bfloat16) holds non-finite values after specialization: wrong "
        "dtype or layout?"
    )
    for bits, finite in ((0x7FC0, False), (0x7F80, False), (0xFF81, False), (0x7F7F, True)):
        assert all_finite(np.array([0x3F80, bits], np.uint16), "bfloat16") is finite
