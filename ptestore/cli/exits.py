"""Exit statuses of the ``ptestore`` command and the one place that maps errors onto them.

=====  ================================================================================
0      success
1      failure at run time: a backend failed, storage I/O failed (after retries), a publish
       was uncertain or partial, a published object failed its integrity check, the
       process ran out of memory (``MemoryError``). Rerunning may succeed.
2      bad input or usage: a malformed container (:class:`FormatError`), bad arguments or
       options (:class:`ConfigurationError`, argparse usage errors), a missing source
       (:class:`ObjectNotFound`), an existing destination under ``--create``
       (:class:`AlreadyExists`), refused credentials or access (:class:`PermissionDenied`).
       Rerunning the same command gives the same answer: fix the input first.
130    interrupted (Ctrl-C)
=====  ================================================================================
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._text import shown
from ..errors import (
    AlreadyExists,
    ConfigurationError,
    FormatError,
    IntegrityError,
    ObjectNotFound,
    PartialPublish,
    PermissionDenied,
    PteStoreError,
    PublishUncertain,
    StorageError,
)
from .parser import Parser

if TYPE_CHECKING:
    import logging

    from .output import Output

__all__ = [
    "BAD_INPUT_ERRORS",
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "Command",
    "OutputError",
    "Parser",
    "configure_logging",
    "error_json",
    "error_message",
    "exit_code",
    "guarded",
    "redacted",
    "with_verdict",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

#: Errors that mean "the command as given cannot succeed": exit :data:`EXIT_BAD_INPUT`.
BAD_INPUT_ERRORS: tuple[type[PteStoreError], ...] = (
    FormatError,
    ConfigurationError,
    ObjectNotFound,
    AlreadyExists,
    PermissionDenied,
)

Command = Callable[[argparse.Namespace], int]


def exit_code(exc: BaseException) -> int | None:
    """The exit status for an error, or None for one that is not ours to map (a bug:
    let it propagate with its traceback)."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, PartialPublish):
        return EXIT_FAILURE
    if isinstance(exc, BAD_INPUT_ERRORS):
        return EXIT_BAD_INPUT
    if isinstance(exc, (PteStoreError, OSError)) or out_of_memory(exc):
        return EXIT_FAILURE
    return None


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the process ran out of memory: a ``MemoryError``; a thread
    that could not start (``RuntimeError: can't start new thread``: a pool's worker, the
    S3 writer's parts); a module's shared object that could not be mapped (an
    ``ImportError`` "failed to map segment from shared object", "Cannot allocate
    memory": a lazy import under ``ulimit -v``)."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    if type(exc) is RuntimeError:  # (its subclasses: RecursionError, NotImplementedError)
        return "can't start new thread" in text or "can't create new thread" in text
    if isinstance(exc, ImportError):
        return "failed to map segment" in text or "Cannot allocate memory" in text
    return False


def _text(exc: BaseException) -> str:
    """What an error says: its message; for a ``MemoryError`` (mostly without one) that
    the process ran out of memory, and where a limit may come from."""
    if out_of_memory(exc):
        said = f" ({exc})" if str(exc) else ""
        return (
            f"out of memory{said}: an allocation failed (the process's address-space "
            "limit, ulimit -v, or the machine's memory); rerun with more memory"
        )
    return str(exc)


def _signal_of(exc: BaseException) -> str:
    """`` by SIGTERM`` when ``exc`` (or what it was raised from) is a signal handled as
    Ctrl-C (:mod:`ptestore._signals`); empty for Ctrl-C itself."""
    seen = exc
    for _ in range(4):
        name = getattr(seen, "signal_name", None)
        if isinstance(name, str):
            return f" by {name}"
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            return ""
        seen = nxt
    return ""


def _after(exc: BaseException, published: str | None) -> bool:
    """Whether ``exc`` came once ``published`` was (an error or Ctrl-C while the command
    reported it: :func:`ptestore.cli.output.published`), not in a publish."""
    return published is not None and not isinstance(exc, (PartialPublish, PublishUncertain))


def error_message(
    command: str, exc: BaseException, *, publishes: bool = False, published: str | None = None
) -> str:
    """The one line printed on stderr for an error of ``ptestore COMMAND``, every URL in
    it as :func:`~ptestore.storage.types.redacted_url` shows it (a message a library
    made, or one built from a URL as given, holds no password nor signature).

    ``publishes``: the command publishes objects, so a failure says what was published;
    ``published``: what it had published when ``exc`` came (while reporting it)."""
    from ..storage.types import redact_urls

    return redact_urls(_message(command, exc, publishes, published))


def _message(command: str, exc: BaseException, publishes: bool, published: str | None) -> str:
    prog = f"ptestore {command}"
    after = _after(exc, published)
    if isinstance(exc, KeyboardInterrupt):
        by = _signal_of(exc)
        if exc.args:  # raised again by ptestore with what had been published
            return f"{prog}: interrupted{by} {exc.args[0]}"
        if after:
            return f"{prog}: interrupted{by} after {published} was published"
        return f"{prog}: interrupted{by}" + ("; nothing was published" if publishes else "")
    if after:
        return f"{prog}: failed after publishing {published}: {_text(exc)}"
    if isinstance(exc, PartialPublish):
        return f"{prog}: failed after a partial publish: {exc}"
    if not publishes or isinstance(exc, BAD_INPUT_ERRORS):
        return f"{prog}: error: {_text(exc)}"
    if isinstance(exc, PublishUncertain):
        return f"{prog}: publish uncertain (it may or may not have taken effect): {exc}"
    if isinstance(exc, IntegrityError) and exc.published:
        return f"{prog}: failed after publishing: {exc}"
    return f"{prog}: failed, nothing published: {_text(exc)}"


def _publish_state(exc: BaseException, published: str | None = None) -> str:
    if _after(exc, published):
        return "published"
    if isinstance(exc, PartialPublish):
        return "partial"
    if isinstance(exc, PublishUncertain):
        return "uncertain"
    if isinstance(exc, IntegrityError) and exc.published:
        return "published"
    return "nothing"


#: Attributes of ptestore errors copied into the JSON error object when set.
_ERROR_FIELDS = (
    "backend",
    "spec",
    "method",
    "key",
    "source",
    "field",
    "limit",
    "backend_ids",
    "installed",
    "hint",
    "published",
)


def error_json(
    command: str,
    exc: BaseException,
    code: int,
    *,
    publishes: bool = False,
    published: str | None = None,
) -> dict[str, Any]:
    """The object ``--json`` prints on stdout when ``ptestore COMMAND`` fails:
    ``{"error": {"type", "message", "exit_code", "command", ...}}`` (``message`` as stderr
    shows it, with the backend, method and key it names) plus the error's own
    attributes (``backend``/``method``/``key`` of a :class:`BackendError`,
    ``source``/``field``/``value``/``limit`` of a :class:`FormatError`, ...), the
    chained cause (``cause``: ``"Type: message"``) and, for commands that publish,
    ``published``: ``"nothing"``, ``"partial"``, ``"uncertain"`` or ``"published"`` (an
    error once ``published``, the argument, was: while the command reported it). Every
    URL in its strings is shown as :func:`error_message` shows it."""
    message = _text(exc) or type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):  # what stderr says: "interrupted by SIGTERM; ..."
        said = error_message(command, exc, publishes=publishes, published=published)
        message = said.partition(": ")[2]
    err: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": message,
        "exit_code": code,
        "command": command,
    }
    for name in _ERROR_FIELDS:
        value = getattr(exc, name, None)
        if value is None or value == ():
            continue
        if name == "published" and isinstance(value, tuple):
            err["published_files"] = list(value)
            continue
        err[name] = list(value) if isinstance(value, tuple) else value
    if isinstance(exc, FormatError):
        err["value"] = shown(exc.value)
    cause = exc.__cause__
    if cause is None and not exc.__suppress_context__:
        cause = exc.__context__
    if cause is not None:
        err["cause"] = f"{type(cause).__name__}: {cause}"
    if publishes:
        err["published"] = _publish_state(exc, published)
    return {"error": redacted(err)}


def redacted(value: Any) -> Any:
    """``value`` (what a command prints: a string, or JSON's dicts and lists of them)
    with every URL in its strings as :func:`~ptestore.storage.types.redacted_url` shows
    it: a URL as the user gave it (``verify URL``), a record an earlier ptestore wrote,
    a library's message may hold a password or a presigned query's signature."""
    from ..storage.types import redact_urls

    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v) for v in value]
    return value


def configure_logging(args: argparse.Namespace) -> logging.Handler | None:
    """Send the ``ptestore.*`` loggers to stderr at the level ``-v`` (INFO), ``-vv`` or
    ``--debug`` (DEBUG) ask for; the handler to remove afterwards, or None when neither
    was given (a warning no handler takes then reaches stderr as
    ``ptestore COMMAND: warning: ...``: :mod:`ptestore._log`)."""
    verbose = int(getattr(args, "verbose", 0) or 0)
    debug = bool(getattr(args, "debug", False))
    if not verbose and not debug:
        return None
    import logging  # here: ``ptestore --help`` does not pay for it

    from .._text import for_terminal
    from ..storage.types import redact_urls

    class Escaped(logging.Formatter):
        """A record as a terminal shows it: what would act on it escaped, its URLs
        redacted (a client library's debug line may name one with its credentials)."""

        def format(self, record: logging.LogRecord) -> str:
            return for_terminal(redact_urls(super().format(record)))

    class Verbose(logging.StreamHandler):  # type: ignore[type-arg]
        """The run's handler; ``previous``: the level it set the logger's from."""

        previous = logging.NOTSET

    handler = Verbose(sys.stderr)
    handler.setFormatter(Escaped("%(name)s: %(levelname)s: %(message)s"))
    logger = logging.getLogger("ptestore")
    handler.previous = logger.level  # put back afterwards (a caller of main() may set one)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug or verbose > 1 else logging.INFO)
    return handler


def with_verdict(code: int, write: Callable[[], None]) -> int:
    """``write()`` a verdict's output and return its exit status ``code``, also when the
    reader of stdout went away (``| head``, ``| true``): a verdict's status is the
    answer, not the printing of it, so a failed check never turns into a success. (What
    :func:`~ptestore.cli.output.out` writes never stops a command: every command ends
    with its own status; a stdout that cannot be written is said by :func:`guarded`.)"""
    from .output import silence

    try:
        write()
    except BrokenPipeError:
        silence(sys.stdout, 1)
    return code


class OutputError(StorageError):
    """stdout could not be written (a full disk, an I/O error, closed): the output of a
    command that did its work otherwise."""


def _output_failed(command: str, code: int, state: Output, publishes: bool) -> int:
    """The command ran, but stdout could not be written: one error line, the status
    ``code`` when it is a failure's, else :data:`EXIT_FAILURE`."""
    from .._text import one_line
    from .output import say

    failed = state.failed
    assert failed is not None
    why = failed.strerror or str(failed)
    exc = OutputError(f"cannot write the output on stdout: {why}")
    say(one_line(error_message(command, exc, publishes=publishes, published=state.published)))
    return code if code != EXIT_OK else EXIT_FAILURE


def _failed(
    command: str, exc: BaseException, args: argparse.Namespace, state: Output, publishes: bool
) -> int:
    """``exc`` ended the command: its line on stderr, its ``--json`` object on stdout
    when none of the output was written, its exit status."""
    from .._text import one_line
    from .output import flush_stdout, out_json, say, silence, stdout_reader_gone

    if state.writing:  # stopped in a write: what stdout's buffer holds is dropped
        silence(sys.stdout, 1)
    if isinstance(exc, BrokenPipeError) and not state.written and stdout_reader_gone():
        silence(sys.stdout, 1)  # a write to stdout outside out(): its reader went away
        return EXIT_OK
    flush_stdout(state)
    code = exit_code(exc)
    assert code is not None  # every type caught here is mapped
    debug = bool(getattr(args, "debug", False))
    if debug and sys.stderr is not None:
        import traceback

        from ..storage.types import redact_urls

        # its URLs redacted: a library's exception in the chain (an HTTP client's names
        # the URL it requested, presigned query included) and a frame's line alike
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            sys.stderr.write(redact_urls(text))
            sys.stderr.flush()
        except OSError:
            pass
    line = error_message(command, exc, publishes=publishes, published=state.published)
    say(one_line(line))
    if not debug and exc.__cause__ is not None and not isinstance(exc, KeyboardInterrupt):
        say(
            f"ptestore {command}: (--debug prints the full traceback, "
            f"{type(exc.__cause__).__name__} included)"
        )
    # The error object, unless stdout holds (a part of) the command's own document or
    # cannot be written: never a document followed by another.
    if getattr(args, "json", False) and not state.written and not state.dropped:
        out_json(error_json(command, exc, code, publishes=publishes, published=state.published))
    return code


def guarded(command: str, *, publishes: bool = False) -> Callable[[Command], Command]:
    """Decorate a sub-command's ``run`` function: errors become a message on stderr (and
    with ``--json`` an :func:`error_json` object on stdout) and the exit status of
    :func:`exit_code`; anything else propagates. ``-v``/``--debug`` turn on the
    ``ptestore.*`` logs for the run; ``--debug`` also prints the full traceback of a
    mapped error, chained causes (the backend's own exception) included. Without them,
    a warning of the library that no handler takes is a line
    ``ptestore COMMAND: warning: MESSAGE`` (:func:`ptestore._log.command_started`);
    the state is restored when the command ends, however it ends. The command's output
    goes through :mod:`ptestore.cli.output`: a stdout that cannot be written is an
    error line (:class:`OutputError`), its reader gone leaves the status as it is."""

    def wrap(run: Command) -> Command:
        @functools.wraps(run)
        def guarded_run(args: argparse.Namespace) -> int:
            handler = configure_logging(args)
            from .._log import command_ended, command_started
            from .output import command_output, end_output, flush_stdout

            # records escaped, and those no handler takes printed in this command's
            # form, ``ptestore COMMAND: warning: ...`` (ptestore._log)
            token = command_started(command)
            state, output = command_output()
            try:
                try:
                    if publishes:  # SIGTERM/SIGHUP take Ctrl-C's path (ptestore._signals)
                        from .._signals import termination_as_interrupt

                        with termination_as_interrupt():
                            code = run(args)
                    else:
                        code = run(args)
                    flush_stdout(state)
                except (KeyboardInterrupt, PteStoreError, OSError, MemoryError) as exc:
                    return _failed(command, exc, args, state, publishes)
                except (RuntimeError, ImportError) as exc:
                    if not out_of_memory(exc):
                        raise  # a bug: its traceback
                    return _failed(command, exc, args, state, publishes)
                if state.failed is not None:
                    return _output_failed(command, code, state, publishes)
                return code
            finally:
                end_output(output)
                command_ended(token)
                if handler is not None:
                    import logging

                    logger = logging.getLogger("ptestore")
                    logger.removeHandler(handler)
                    logger.setLevel(getattr(handler, "previous", logging.NOTSET))

        return guarded_run

    return wrap
