"""``command``: run an external program per blob, the way many vendor compilers ship.

For every delegate blob of its backend id, and then for every named data key of the
model, the program runs once with the bytes on stdin and these environment variables:

===========================  =============================================================
``PTESTORE_KIND``            ``processed`` (a delegate blob) or ``named_data``
``PTESTORE_BACKEND_ID``      the ``BackendDelegate.id`` being specialized
``PTESTORE_METHOD``          the method of the delegate (``processed`` only)
``PTESTORE_METHODS``         every method sharing the blob, comma-separated
``PTESTORE_KEY``             the named data key (``named_data`` only)
``PTESTORE_COMPILE_SPECS``   JSON object ``{key: hex value}`` of the delegate's specs
``PTESTORE_TENSOR_LAYOUT``   JSON layout of the key, or ``null``
``PTESTORE_TENSOR_INFO``     JSON ``TensorInfo.to_json()`` of the key, or ``null``
``PTESTORE_SHARED_KEYS``     JSON object ``{key: tensor info or null}`` of the other keys
                             stored in the same bytes (``{}`` normally, and for a blob):
                             they must all be given the same bytes, or all kept
``PTESTORE_SIZE``            number of input bytes
``PTESTORE_DEVICE``          the device profile's name (empty when the run names none)
``PTESTORE_DEVICE_OPTIONS``  JSON object of the device profile's options (``{}`` if none)
``PTESTORE_DEVICE_DIGEST``   the digest of those options (empty if no device)
===========================  =============================================================

What it writes to stdout replaces the input. Empty stdout means "keep the input as it
is"; a replacement may have any size (the program's output is its own format). A
non-zero exit status (or a signal) fails the whole run cleanly (nothing is published)
with the end of the program's stderr in the error. Every replacement asks for the
constructor's ``alignment`` (default: none beyond the original segment's).

The program runs in a session of its own, with stdout and stderr sent to temporary
files (only the last :data:`STDERR_TAIL` characters of stderr are read back): the run
ends when the program exits, whatever it leaves running. ``timeout`` (the constructor's,
or ``timeout=SECONDS`` leading the command line of a SPEC:
``command@QnnBackend=timeout=600 qnn-compile``) bounds each run; a timeout, Ctrl-C,
SIGTERM (as ``ptestore._signals`` raises it) or any other exception stops the program's
whole process group: SIGTERM, :data:`STOP_GRACE` seconds, SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO

from ..errors import BackendError, ConfigurationError
from .api import BackendData, BackendDataInitContext, BackendDataWriter, BackendInterface

if TYPE_CHECKING:
    from ..format.tensorinfo import TensorInfo

__all__ = ["CommandBackend"]


class CommandBackend(BackendInterface):
    """Pipe each blob through ``command`` (a command line string or an argv list)."""

    name = "*"

    def __init__(
        self,
        command: str | Sequence[str] | None = None,
        *,
        named_data: bool = True,
        processed: bool = True,
        alignment: int | None = None,
        timeout: float | None = None,
    ) -> None:
        if command is None or (isinstance(command, str) and not command.strip()):
            raise ConfigurationError(
                "the command backend needs a program: use command=PROGRAM ARGS "
                "(e.g. --backend 'command@XnnpackBackend=python3 pack.py')"
            )
        if isinstance(command, str):
            try:
                self.argv = shlex.split(command)
            except ValueError as exc:  # "No closing quotation", "No escaped character"
                raise ConfigurationError(
                    f"the command backend cannot parse its command line {command!r}: {exc} "
                    "(close every quote; quote or escape arguments that contain spaces)"
                ) from None
            while self.argv and self.argv[0].startswith("timeout="):  # the SPEC's options
                if timeout is not None:
                    raise ConfigurationError(
                        f"the command backend got two timeouts: {self.argv[0]!r} in its "
                        f"command line {command!r} and timeout={timeout!r}"
                    )
                timeout = _seconds(self.argv.pop(0).partition("=")[2], command)
        else:
            self.argv = list(command)
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < float("inf")
        ):
            raise ConfigurationError(
                f"the command backend's timeout must be a number of seconds > 0, got {timeout!r}"
            )
        if not self.argv:
            raise ConfigurationError(
                f"the command backend needs a program, got {command!r}: use command=PROGRAM "
                "ARGS (e.g. --backend 'command@XnnpackBackend=python3 pack.py')"
            )
        self.named_data = named_data
        self.processed = processed
        self.alignment = alignment
        self.timeout = timeout

    def __repr__(self) -> str:
        """Its command, the id it serves and its options other than the defaults (what
        the device cache keys an instance's settings by)."""
        shown = [f"name={self.name!r}"]
        for option, default in (
            ("named_data", True),
            ("processed", True),
            ("alignment", None),
            ("timeout", None),
        ):
            value = getattr(self, option)
            if value != default:
                shown.append(f"{option}={value!r}")
        return f"CommandBackend({shlex.join(self.argv)!r}, {', '.join(shown)})"

    def _run(
        self, data: bytes, env: dict[str, str], what: str, backend: str, **where: str | None
    ) -> bytes:
        full_env = dict(os.environ)
        full_env.update(env)
        # stdout and stderr go to files, not pipes: a background process the program
        # leaves behind with them open cannot hold the run up, and stderr costs only
        # the tail that is read back
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            rc = self._wait(data, full_env, out, err, what, backend, where)
            if rc != 0:
                tail = _tail(err)
                raise BackendError(
                    f"command {shlex.join(self.argv)!r} {_ended(rc)} on {what}"
                    + (f": {tail}" if tail else ""),
                    backend=backend,
                    **where,
                )
            out.seek(0)
            return out.read()

    def _wait(
        self,
        data: bytes,
        env: dict[str, str],
        out: BinaryIO,
        err: BinaryIO,
        what: str,
        backend: str,
        where: dict[str, str | None],
    ) -> int:
        """Run the program in a session of its own and return its exit status; a
        timeout, Ctrl-C or any other exception stops its whole process group."""
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # its children too are stopped with it
            )
        except OSError as exc:
            raise BackendError(_not_started(self.argv[0], exc), backend=backend, **where) from None
        try:
            proc.communicate(data, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            tail = _tail(err)
            raise BackendError(
                f"command {shlex.join(self.argv)!r} timed out after {self.timeout:g} s on "
                f"{what} (stopped with its process group)" + (f": {tail}" if tail else ""),
                backend=backend,
                **where,
            ) from None
        except BaseException:  # Ctrl-C, SIGTERM (as Terminated), anything: no orphans
            _stop_group(proc)
            raise
        return proc.returncode

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        bid = context.backend_id
        device = context.device
        device_env = (
            device.environment()
            if device is not None
            else {
                "PTESTORE_DEVICE": "",
                "PTESTORE_DEVICE_OPTIONS": "{}",
                "PTESTORE_DEVICE_DIGEST": "",
            }
        )
        for item in context:
            if not self.processed:
                continue
            env = {
                "PTESTORE_KIND": "processed",
                "PTESTORE_BACKEND_ID": bid,
                "PTESTORE_METHOD": item.method,
                "PTESTORE_METHODS": ",".join(item.methods),
                "PTESTORE_KEY": "",
                "PTESTORE_COMPILE_SPECS": json.dumps(
                    {s.key: s.value.hex() for s in item.compile_specs}
                ),
                "PTESTORE_TENSOR_LAYOUT": "null",
                "PTESTORE_TENSOR_INFO": "null",
                "PTESTORE_SHARED_KEYS": "{}",
                "PTESTORE_SIZE": str(len(item.processed)),
                **device_env,
            }
            out = self._run(bytes(item.processed), env, "a delegate blob", bid, method=item.method)
            if out:
                output.write_processed_data(BackendData(out, alignment=self.alignment))
        if not self.named_data:
            return
        named = context.get_named_data_map()
        done = context.replaced_keys  # a generic backend serving several ids: once per key
        for key in list(named.keys()):
            if key in done:
                continue
            layout = named.get_tensor_layout(key)
            info = named.get_tensor_info(key)
            data = bytes(named.get_data(key))
            env = {
                "PTESTORE_KIND": "named_data",
                "PTESTORE_BACKEND_ID": bid,
                "PTESTORE_METHOD": "",
                "PTESTORE_METHODS": "",
                "PTESTORE_KEY": key,
                "PTESTORE_COMPILE_SPECS": "{}",
                "PTESTORE_TENSOR_LAYOUT": json.dumps(None if layout is None else layout.to_json()),
                "PTESTORE_TENSOR_INFO": json.dumps(_info_json(info)),
                # The program runs once per key: what it must know to give every key of
                # a shared segment the same bytes (or keep them all).
                "PTESTORE_SHARED_KEYS": json.dumps(
                    {k: _info_json(named.get_tensor_info(k)) for k in named.get_shared_keys(key)}
                ),
                "PTESTORE_SIZE": str(len(data)),
                **device_env,
            }
            out = self._run(data, env, f"key {key!r}", bid, key=key)
            if out:
                # The program's output is its own format: its size is its business.
                output.write_named_data(
                    key, BackendData(out, alignment=self.alignment, allow_size_change=True)
                )


def _info_json(info: TensorInfo | None) -> object:
    return None if info is None else info.to_json()


def _seconds(text: str, command: str) -> float:
    """``timeout=SECONDS`` at the start of a command line: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigurationError(
            f"the command backend's timeout={text} (in {command!r}) must be a number of "
            "seconds > 0 (e.g. command@QnnBackend=timeout=600 qnn-compile ...)"
        )
    return value


#: Seconds a stopped program's process group has to end after SIGTERM (a timeout,
#: Ctrl-C, SIGTERM to ptestore) before SIGKILL.
STOP_GRACE = 2.0
#: Characters of the program's stderr put into an error.
STDERR_TAIL = 2000


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the program's process group (it leads one: ``start_new_session``), give
    the program :data:`STOP_GRACE` seconds to end, then SIGKILL whatever is left of the
    group (its own children included)."""
    try:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE)
    finally:  # also when a second Ctrl-C cuts the grace short
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(err: BinaryIO) -> str:
    """The last :data:`STDERR_TAIL` characters of the program's stderr (stripped): only
    the end of the file is read."""
    size = err.seek(0, os.SEEK_END)
    err.seek(max(0, size - 4 * STDERR_TAIL))  # at most 4 bytes a character in UTF-8
    return err.read().decode("utf-8", "replace").strip()[-STDERR_TAIL:]


def _ended(rc: int) -> str:
    """``exited with status 3`` or ``was killed by SIGKILL``."""
    if rc >= 0:
        return f"exited with status {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    return f"was killed by {name}"


def _not_started(program: str, exc: OSError) -> str:
    """Why ``program`` could not be started: not found, or found but not executable
    (execve's ENOENT for a script whose ``#!`` interpreter is missing)."""
    if isinstance(exc, FileNotFoundError):
        path = program if os.sep in program else shutil.which(program)
        if path is None or not os.path.isfile(path):
            return f"command {program!r} not found"
        where = repr(program) + ("" if path == program else f" ({path})")
        try:
            with open(path, "rb") as f:
                first = f.readline(1024)
        except OSError:
            first = b""
        words = first[2:].split() if first.startswith(b"#!") else []
        if words:
            interpreter = os.fsdecode(words[0])
            return (
                f"command {where} exists but cannot be executed: the interpreter its #! "
                f"line names, {interpreter!r}, is missing"
            )
        return (
            f"command {where} exists but cannot be executed: {exc.strerror} "
            "(is its interpreter or loader missing?)"
        )
    if isinstance(exc, PermissionError):
        return f"command {program!r} cannot be executed: {exc.strerror} (is it executable?)"
    return f"command {program!r} cannot be started: {exc.strerror or exc}"
