"""Run the backends: every backend id of the program that has an implementation is
called exactly once, through a :class:`~.session.Session` that validates and spools each
replacement as it arrives; what each call did goes into its :class:`BackendReport`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .._log import get_logger
from ..backends.api import BackendDataInitContext, BackendDataWriter, BackendInterface
from ..backends.passthrough import PassthroughBackend
from ..backends.registry import BackendLike, declared_backends
from ..errors import BackendError, NotSupported, StorageError, describe_exception
from .report import BackendReport, Event, SpecializationReport
from .run import Run
from .selection import resolve_backends, why_unchanged
from .session import Session

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..provenance.stamp import Stamper

__all__ = ["run_backends"]

log = get_logger("ptestore.coordinator")


def run_backends(
    run: Run,
    backends: Iterable[BackendLike] | None,
    device: DeviceProfile | None,
    stamper: Stamper | None,
) -> SpecializationReport:
    """Run every backend; the report so far (no files yet), with why nothing was
    specialized if nothing was."""
    c = run.pte.container
    ids = list(dict.fromkeys(d.id for d in c.delegates))
    log.debug("backend ids in %s: %s", run.pte.loader.name, ids)
    sel = resolve_backends(backends, ids)
    reports: list[BackendReport] = []
    for bid in ids:
        impl = sel.impls.get(bid)
        report = BackendReport(bid, sel.labels.get(bid), "no_implementation")
        reports.append(report)
        if impl is not None:
            _run_backend(run, impl, bid, report, device, stamper)
    reason, hint = why_unchanged(
        sel,
        reports,
        has_ptd=len(run.files) > 1,
        pte_has_named_data=bool(c.named_data),
        ptd_spelling=run.ptd_spelling,
    )
    summary = SpecializationReport(
        reports, [], 0.0, unused_backends=sel.unused, source=run.pte.loader.name
    )
    if reason is not None:
        log.info("nothing specialized: %s", reason)
        summary.unchanged_reason, summary.hint = reason, hint
        summary.installed_backends = declared_backends()  # imports nothing more
    return summary


def _run_backend(
    run: Run,
    impl: BackendInterface,
    bid: str,
    report: BackendReport,
    device: DeviceProfile | None,
    stamper: Stamper | None,
) -> None:
    session = Session(run, bid, report)
    run.specs[bid] = report.implementation
    run.emit(Event("backend_start", backend=bid))
    t0 = time.perf_counter()
    context = BackendDataInitContext(session, device)
    try:
        try:
            # Typed to return None, but a generator function or an async def returns
            # an object whose body never ran: look at what really came back.
            call: Callable[..., object] = impl.initialize_backend_data
            if stamper is not None:  # once per run, before the call (recorded as read)
                stamper.version(impl, bid)
            try:
                result = call(context, BackendDataWriter(session))
            except NotSupported:
                session.end_writes()
                _note(stamper, bid, impl, context)
                raise
            # From the return on, no submission is accepted (a thread of the backend's
            # still running), while compatibility_info may still read the context.
            session.end_writes()
            _note(stamper, bid, impl, context)
        finally:
            # The context and writer are valid only during the call. Not waiting for a
            # writer in flight (a Ctrl-C while a thread pulls a chunk iterator): it fails
            # at its next chunk.
            session.close()
        _check_returned(result, bid, report.implementation)
    except NotSupported as exc:
        report.status = "not_supported"
        report.reason = str(exc) or "NotSupported raised with no message"
    except BackendError as exc:  # the session's own name the backend; one it raised may not
        exc.name_backend(bid, report.implementation, session.last_method, session.last_key)
        raise
    except KeyboardInterrupt:
        raise
    except StorageError:
        # A read of the model's files failing inside the call (a source replaced while
        # read, a connection lost after the storage's own retries) is not the backend's
        # failure: it stays what it is, so that the fleet runs the pair again where a
        # storage error is transient, and the message names the file, not the backend.
        log.info("backend %s (%s): a storage error ended its call", bid, report.implementation)
        raise
    except BaseException as exc:  # backend code is user code
        # SystemExit, GeneratorExit or a custom BaseException from a backend must not
        # end the program silently: it is a backend failure like any other.
        raise BackendError(
            f"initialize_backend_data failed: {describe_exception(exc)}",
            backend=bid,
            method=session.last_method,
            key=session.last_key,
            spec=report.implementation,
        ) from exc
    else:
        if session.refused is not None:  # caught by the backend, which went on: the run stops
            raise session.refused
        session.commit()
        if session.keys or session.blobs or isinstance(impl, PassthroughBackend):
            report.status = "specialized"
        else:  # writing nothing is declining (passthrough's whole job is to write nothing)
            report.status = "not_supported"
            report.reason = (
                f"returned without writing anything ({report.inputs_seen} delegate inputs "
                "seen); raise NotSupported('why') to say why"
            )
    finally:
        report.seconds = time.perf_counter() - t0
    log.info(
        "backend %s (%s): %s in %.3f s, %d inputs, %d keys and %d blobs replaced",
        bid,
        report.implementation,
        report.status,
        report.seconds,
        report.inputs_seen,
        len(report.keys_replaced),
        report.blobs_replaced,
    )
    run.emit(Event("backend_end", backend=bid, seconds=report.seconds, status=report.status))


def _note(
    stamper: Stamper | None, bid: str, impl: BackendInterface, context: BackendDataInitContext
) -> None:
    """Stamp the backend into the provenance while its context is still valid."""
    if stamper is not None:
        stamper.note(bid, impl, context)


def _check_returned(result: object, bid: str, spec: str | None) -> None:
    """``initialize_backend_data`` does its work during the call: a generator, coroutine
    or other awaitable returned instead means its body never ran."""
    if result is None:
        return
    import inspect  # only for what a backend should not return: start-up is measured

    kind = None
    if inspect.isgenerator(result):
        kind = "a generator (is initialize_backend_data a generator function?)"
    elif inspect.isasyncgen(result):
        kind = "an async generator"
    elif inspect.isawaitable(result):
        kind = "a coroutine or awaitable (is initialize_backend_data an async def?)"
    if kind is None:
        try:
            text = repr(result)
        except Exception:  # a hostile __repr__: the type says enough
            text = "(unprintable)"
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise BackendError(
            f"initialize_backend_data returned {type(result).__name__} {shown}, not None: "
            "a return value is ignored, so nothing it holds would reach the output; "
            "submit replacements with output.write_named_data(key, BackendData(...)) "
            "and output.write_processed_data(BackendData(...)), then return None",
            backend=bid,
            spec=spec,
        )
    if inspect.isgenerator(result) or inspect.iscoroutine(result):
        result.close()  # no "never awaited" warning; the body still never ran
    raise BackendError(
        f"initialize_backend_data returned {kind}, so its body never ran: it must do its "
        "work during the call and return None",
        backend=bid,
        spec=spec,
    )
