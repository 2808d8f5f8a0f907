"""The backend contract as a reusable pytest mixin (needs ``pytest``).

Usage, for any backend::

    from ptestore.testing import BackendContract

    class TestMyBackend(BackendContract):
        def make_backend(self) -> BackendInterface:
            return MyBackend()          # a fresh instance each time

pytest then runs every check over the small real programs shipped with ptestore
(:mod:`ptestore.testing.programs`: plain, quantized, aliased scales, a blob shared by two
delegates, two methods, weights in a ``.ptd``):

- ``test_runs_or_declines``: the run succeeds, or the backend declines and says why
  (``NotSupported('why')``; returning without writing anything says nothing, and fails);
- ``test_specializes_something``: over all the programs, the backend replaces something
  somewhere: one that declines (or replaces nothing in) every program fails, unless the
  class sets ``declines_on_purpose = True`` (a backend that only inspects, or
  passthrough);
- ``test_keeps_keys_and_shared_bytes``: the output has the same keys, and keys that share
  stored bytes in the source still hold identical bytes;
- ``test_second_run_changes_nothing``: specializing the output again gives the same
  bytes (unless :meth:`~BackendContract.rerun_changes` says why it must not);
- ``test_replacements_match_tensor_info``: a replaced value keeps the byte size its
  tensor info records (unless the class sets ``changes_sizes = True``) and a float value
  stays finite (a ``bfloat16`` one by its exponent bits: ``get_array`` gives its bit
  patterns);
- ``test_loads_in_runtime``: the output loads in the ExecuTorch runtime and every method
  gives the reference outputs within tolerance (skipped, with the reason, when
  ExecuTorch is not installed);
- ``test_deterministic``: two runs with fresh instances give identical bytes;
- ``test_records_a_stable_version``: the version the artifact records is what a fresh
  instance reports, read twice, and what the run's instance still reports after its
  call (verify, a fleet plan and the device cache compare versions: one that changes
  makes every artifact stale at once);
- ``test_compatibility_round_trip``: ``compatibility_info`` is a string stamped into the
  provenance, and ``check_compatibility`` on it returns a :class:`Compatibility`
  (``OPTIMAL`` for the device the artifact was made for), with and without a device.

The key, tensor-info and runtime checks and the compatibility check each run twice
(``[device]``, ``[no-device]``): on what the backend made for the kit's device and on
what it made for no device (``context.device`` None), so a backend that does something
else without a device (zeroes the weights, say) is checked as well.

Hooks (override what you need): :meth:`make_device` (the device profile of the runs),
:meth:`contract_programs` (which programs; add your own :class:`Program`),
:meth:`reference_outputs` and :meth:`tolerance` (what the runtime must return),
:meth:`rerun_changes`, and the class attributes ``serve_id`` (make a generic backend
serve one id, as ``SPEC@ID`` does), ``changes_sizes`` and ``declines_on_purpose``.

``tests/backends/test_backend_kit_meta.py`` runs the kit over wrong backends (one that
does nothing, a typo that declines everywhere, nondeterministic, not idempotent, one
that changes what the model computes, one that zeroes the weights only without a device,
an output that lost a key, a version that changes between reads or during the call)
and checks that each is failed by the check meant to catch it, and that disabling any
check is noticed.

A failed run's message shows the backend's own traceback (its file and line).
Each program is specialized a few times per class (first run, second run, a determinism
run, a run without a device) and the results are shared by the checks.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import pytest

from ..backends.api import BackendInterface
from ..backends.compat import Compatibility, DeviceProfile
from ..backends.rating import rate
from ..backends.registry import object_label, serving
from ..backends.versions import version_of
from ..errors import PteStoreError
from ..provenance import read_provenance
from ..storage.loaders import BytesLoader
from .contract_outcomes import (
    FLOAT_DTYPES,
    Outcome,
    all_finite,
    allow_unchanged,
    describe_failure,
    named_outputs,
    read_optional,
    said_why,
)
from .programs import Program, shipped_programs
from .runtime import compare_outputs, run_in_runtime, runtime_unavailable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BackendContract", "Outcome"]  # Outcome: from .contract_outcomes


#: (contract class, program, run) -> outcome, shared by the checks of one class.
_OUTCOMES: dict[tuple[type, str, str], Outcome] = {}
#: (contract class, program, with a device) -> runtime outputs of that run's output.
_RUNTIME: dict[tuple[type, str, bool], dict[str, list[np.ndarray]] | BaseException] = {}

#: The checks of what a run made, run on the run with the kit's device and on the one
#: without a device (a backend that zeroes weights when it gets no device passed).
_BOTH_RUNS = pytest.mark.parametrize("with_device", [True, False], ids=["device", "no-device"])


class BackendContract:
    """Contract tests every :class:`~ptestore.backends.BackendInterface` should pass."""

    #: Make the backend serve this ``BackendDelegate.id`` (for a generic backend whose
    #: ``name`` is ``"*"``, or one named for another id); None: its own ``name``.
    serve_id: ClassVar[str | None] = None
    #: The backend changes the byte size of named data on purpose
    #: (``BackendData(..., allow_size_change=True)``).
    changes_sizes: ClassVar[bool] = False
    #: The backend replaces nothing in any of the programs on purpose (it only inspects,
    #: or it is a pass-through); without it, declining everywhere fails.
    declines_on_purpose: ClassVar[bool] = False

    # -- hooks --------------------------------------------------------------------
    def make_backend(self) -> BackendInterface:
        """A fresh instance of the backend under test."""
        raise NotImplementedError("a BackendContract subclass implements make_backend()")

    def make_device(self) -> DeviceProfile:
        """The device profile the runs specialize for."""
        return DeviceProfile("ptestore-contract", {"contract": True})

    def contract_programs(self) -> Sequence[Program]:
        """The programs to run over (default: every shipped program)."""
        return shipped_programs()

    def reference_outputs(self, program: Program) -> Mapping[str, Sequence[np.ndarray]] | None:
        """What the specialized program must return per method (default: what the
        unspecialized one returns). None: check only that it loads and every method
        runs and returns outputs of the reference's shapes and dtypes."""
        return program.outputs

    def tolerance(self, program: Program) -> tuple[float, float]:
        """``(atol, rtol)`` for :meth:`reference_outputs` (default: the program's)."""
        return program.atol, program.rtol

    def rerun_changes(self, program: Program) -> str | None:
        """Why specializing an output of this backend again must change it (None: it
        must not; the check then still requires the second run to succeed)."""
        return None

    # -- parametrization -------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "program" in metafunc.fixturenames:
            programs = list(self.contract_programs())
            metafunc.parametrize("program", programs, ids=[p.name for p in programs])

    # -- runs ------------------------------------------------------------------------
    def _backend(self) -> BackendInterface:
        backend = self.make_backend()
        if not isinstance(backend, BackendInterface):
            raise TypeError(
                f"make_backend() returned {type(backend).__name__}, not a BackendInterface"
            )
        if self.serve_id is not None:
            backend = serving(backend, self.serve_id, object_label(backend))
        return backend

    def _run(
        self,
        program: Program,
        run: str,
        pte: bytes | None = None,
        ptd: bytes | None = None,
        *,
        device: bool = True,
    ) -> Outcome:
        cache_key = (type(self), program.name, run)
        if cache_key in _OUTCOMES:
            return _OUTCOMES[cache_key]
        from ..coordinator import specialize

        outcome = Outcome()
        with tempfile.TemporaryDirectory(prefix="ptestore-contract-") as tmp:
            src = os.fspath(program.pte)
            src_ptd = None if program.ptd is None else os.fspath(program.ptd)
            if pte is not None:
                src = os.path.join(tmp, "in.pte")
                with open(src, "wb") as f:
                    f.write(pte)
                if ptd is not None:
                    src_ptd = os.path.join(tmp, "in.ptd")
                    with open(src_ptd, "wb") as f:
                        f.write(ptd)
            dst, dst_ptd = os.path.join(tmp, "out.pte"), os.path.join(tmp, "out.ptd")
            outcome.backend = backend = self._backend()
            try:
                report = specialize(
                    src,
                    dst,
                    ptd=None if src_ptd is None else (src_ptd, dst_ptd),
                    backends=[backend],
                    device=self.make_device() if device else None,
                    provenance=True,
                    **allow_unchanged(),
                )
            except PteStoreError as exc:
                outcome.error = exc
            else:
                outcome.report = report
                with open(dst, "rb") as f:
                    outcome.pte = f.read()
                if src_ptd is not None:
                    with open(dst_ptd, "rb") as f:
                        outcome.ptd = f.read()
                for b in report.backends:
                    if b.status == "not_supported":
                        outcome.declined[b.backend_id] = said_why(b.reason)
        _OUTCOMES[cache_key] = outcome
        return outcome

    def _first(self, program: Program, with_device: bool = True) -> Outcome:
        """The first run with the kit's device (or, ``with_device`` False, the run
        without a device); a failed run fails the check."""
        outcome = self._run(program, "first") if with_device else self._nodev(program)
        if outcome.error is not None:
            run = "specializing" if with_device else "specializing without a device"
            pytest.fail(
                f"{program.name}: {run} failed: {describe_failure(outcome.error)}",
                pytrace=False,
            )
        return outcome

    def _nodev(self, program: Program) -> Outcome:
        return self._run(program, "nodev", device=False)

    # -- checks ----------------------------------------------------------------------
    def test_runs_or_declines(self, program: Program) -> None:
        outcome = self._first(program)
        assert outcome.report is not None
        served = [b for b in outcome.report.backends if b.status != "no_implementation"]
        assert served, (
            f"{program.name}: the backend serves none of the program's backend ids "
            f"{[b.backend_id for b in outcome.report.backends]} (its name is "
            f"{self.make_backend().name!r}); set serve_id, or give programs of your own "
            "backend id with contract_programs()"
        )
        for b in served:
            assert b.status in ("specialized", "not_supported"), b
            if b.status == "not_supported":
                assert outcome.declined.get(b.backend_id), (
                    f"{program.name}: backend {b.backend_id!r} declined without saying why "
                    "(raise NotSupported('why'))"
                )

    def test_specializes_something(self) -> None:
        if self.declines_on_purpose:
            return
        why = []
        for program in self.contract_programs():
            outcome = self._first(program)
            assert outcome.report is not None
            if any(b.keys_replaced or b.blobs_replaced for b in outcome.report.backends):
                return
            reasons = [
                f"{b.backend_id}: {b.status}" + (f" ({b.reason})" if b.reason else "")
                for b in outcome.report.backends
            ]
            why.append(f"{program.name}: {'; '.join(reasons) or 'no backend id'}")
        pytest.fail(
            "the backend replaced nothing in any program of the kit ("
            + " | ".join(why)
            + "); if it declines everything on purpose, set declines_on_purpose = True",
            pytrace=False,
        )

    @_BOTH_RUNS
    def test_keeps_keys_and_shared_bytes(self, program: Program, with_device: bool) -> None:
        outcome = self._first(program, with_device)
        with (
            named_outputs(program.pte.read_bytes(), read_optional(program.ptd)) as src,
            named_outputs(outcome.pte, outcome.ptd) as out,
        ):
            have, want = set(out.keys()), set(src.keys())
            assert have == want, (
                f"{program.name}: the output's keys are not the source's: missing "
                f"{sorted(want - have)}, not in the source {sorted(have - want)}"
            )
            for key in src:
                value = bytes(out.get_data(key))
                for other in src.get_shared_keys(key):
                    assert bytes(out.get_data(other)) == value, (
                        f"{program.name}: keys {key!r} and {other!r} share bytes in the "
                        "source but not in the output"
                    )

    def test_second_run_changes_nothing(self, program: Program) -> None:
        first = self._first(program)
        second = self._run(program, "second", first.pte, first.ptd)
        assert second.error is None, (
            f"{program.name}: specializing the output again failed: "
            f"{describe_failure(second.error)}"
        )
        if self.rerun_changes(program) is None:
            assert second.content() == first.content(), (
                f"{program.name}: specializing the output again changed it; make the "
                "backend idempotent, or say why it must change in rerun_changes()"
            )

    @_BOTH_RUNS
    def test_replacements_match_tensor_info(self, program: Program, with_device: bool) -> None:
        outcome = self._first(program, with_device)
        assert outcome.report is not None
        replaced = {k for b in outcome.report.backends for k in b.keys_replaced}
        with (
            named_outputs(program.pte.read_bytes(), read_optional(program.ptd)) as src,
            named_outputs(outcome.pte, outcome.ptd) as out,
        ):
            for key in sorted(replaced):
                info = src.get_tensor_info(key)
                size = len(out.get_data(key))
                if info is None:
                    continue
                if size != info.nbytes:
                    assert self.changes_sizes, (
                        f"{program.name}: key {key!r} is {info.dtype} {list(info.shape)}, "
                        f"{info.nbytes} bytes, the replacement {size} bytes; set "
                        "changes_sizes = True if the backend changes sizes on purpose"
                    )
                    continue
                if info.dtype in FLOAT_DTYPES and all_finite(src.get_array(key), info.dtype):
                    assert all_finite(out.get_array(key), info.dtype), (
                        f"{program.name}: key {key!r} ({info.dtype}) holds non-finite values "
                        f"after specialization{'' if with_device else ' without a device'}: "
                        "wrong dtype or layout?"
                    )

    @_BOTH_RUNS
    def test_loads_in_runtime(self, program: Program, with_device: bool) -> None:
        reason = runtime_unavailable()
        if reason is not None:
            pytest.skip(reason)
        outcome = self._first(program, with_device)
        key = (type(self), program.name, with_device)
        if key not in _RUNTIME:
            try:
                _RUNTIME[key] = run_in_runtime(outcome.pte, outcome.ptd, inputs=program.inputs)
            except AssertionError as exc:
                _RUNTIME[key] = exc
        outputs = _RUNTIME[key]
        if isinstance(outputs, BaseException):
            pytest.fail(f"{program.name}: {outputs}", pytrace=False)
        reference = self.reference_outputs(program)
        if reference is None:
            problems = compare_outputs(outputs, program.outputs, values=False)
        else:
            atol, rtol = self.tolerance(program)
            problems = compare_outputs(outputs, reference, atol=atol, rtol=rtol)
        run = "" if with_device else " (made without a device)"
        assert not problems, f"{program.name}{run}: " + "; ".join(problems)

    def test_deterministic(self, program: Program) -> None:
        first = self._first(program)
        again = self._run(program, "again")
        assert again.error is None, (
            f"{program.name}: the second run failed: {describe_failure(again.error)}"
        )
        assert again.content() == first.content(), (
            f"{program.name}: two runs with fresh backend instances gave different bytes"
        )

    def test_records_a_stable_version(self, program: Program) -> None:
        outcome = self._first(program)
        record = read_provenance(BytesLoader(outcome.pte))
        assert record is not None and outcome.backend is not None
        fresh = self._backend()
        label = object_label(fresh)
        first, second = version_of(fresh, label), version_of(fresh, label)
        assert first == second, (
            f"the backend's version changed between two reads of one fresh instance "
            f"({first!r}, then {second!r}): make version one value per instance (a class "
            "attribute, or computed once in __init__)"
        )
        versions = [b.version for b in record.backends] + [r.version for r in record.requested]
        recorded = sorted(set(versions))
        assert recorded == [first], (
            f"{program.name}: the artifact records version {', '.join(recorded)}, a fresh "
            f"instance reports {first!r}: verify, a fleet plan and the device cache compare "
            "the recorded version with a fresh instance's, so the artifact would be stale "
            "at once; make version one value per instance"
        )
        after = version_of(outcome.backend, label)
        assert after == first, (
            f"{program.name}: the backend's version changed during its run ({first!r} "
            f"when the run read it, before initialize_backend_data; {after!r} after): "
            "compute it in __init__ (load what it names there), not in "
            "initialize_backend_data"
        )

    @_BOTH_RUNS
    def test_compatibility_round_trip(self, program: Program, with_device: bool) -> None:
        outcome = self._first(program, with_device)
        assert outcome.report is not None
        device = self.make_device() if with_device else None
        record = read_provenance(BytesLoader(outcome.pte))
        assert record is not None, f"{program.name}: the output has no provenance"
        stamps = {s.id: s for s in record.backends}
        for b in outcome.report.backends:
            if b.status == "no_implementation":
                continue
            stamp = stamps[b.backend_id]
            assert isinstance(stamp.compatibility, str)
            for target in (device, self.make_device()):
                # as verify, select and a fleet plan ask it: a failure (sys.exit()
                # included) or an answer that is not a Compatibility fails, named
                try:
                    rating = rate(self._backend(), stamp.compatibility, target, b.backend_id)
                except PteStoreError as exc:
                    pytest.fail(f"{program.name}: {describe_failure(exc)}", pytrace=False)
                if target == device and b.status == "specialized":
                    assert rating is Compatibility.OPTIMAL, (
                        f"{program.name}: an artifact rates {rating.value} for the device it "
                        f"was made for ({'none' if device is None else device.name}); "
                        f"compatibility_info gave {stamp.compatibility!r}"
                    )
