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
``PTESTORE_SIZE``            number of input bytes
``PTESTORE_DEVICE``          the device profile's name (empty when the run names none)
``PTESTORE_DEVICE_OPTIONS``  JSON object of the device profile's options (``{}`` if none)
``PTESTORE_DEVICE_DIGEST``   the digest of those options (empty if no device)
===========================  =============================================================

What it writes to stdout replaces the input. Empty stdout means "keep the input as it
is"; a replacement may have any size (the program's output is its own format). A
non-zero exit status fails the whole run cleanly (nothing is published) with
the end of the program's stderr in the error. Every replacement asks for the
constructor's ``alignment`` (default: none beyond the original segment's).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Sequence

from ..errors import BackendError, ConfigurationError
from .api import BackendData, BackendDataInitContext, BackendDataWriter, BackendInterface

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
        else:
            self.argv = list(command)
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
        return f"CommandBackend({shlex.join(self.argv)!r}, name={self.name!r})"

    def _run(
        self, data: bytes, env: dict[str, str], what: str, backend: str, **where: str | None
    ) -> bytes:
        full_env = dict(os.environ)
        full_env.update(env)
        try:
            proc = subprocess.run(
                self.argv,
                input=data,
                capture_output=True,
                env=full_env,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            raise BackendError(
                f"command {self.argv[0]!r} not found", backend=backend, **where
            ) from None
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"command {shlex.join(self.argv)!r} timed out after {self.timeout} s on {what}",
                backend=backend,
                **where,
            ) from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
            raise BackendError(
                f"command {shlex.join(self.argv)!r} exited with status {proc.returncode} "
                f"on {what}" + (f": {err}" if err else ""),
                backend=backend,
                **where,
            )
        return proc.stdout

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
                "PTESTORE_TENSOR_INFO": json.dumps(None if info is None else info.to_json()),
                "PTESTORE_SIZE": str(len(data)),
                **device_env,
            }
            out = self._run(data, env, f"key {key!r}", bid, key=key)
            if out:
                # The program's output is its own format: its size is its business.
                output.write_named_data(
                    key, BackendData(out, alignment=self.alignment, allow_size_change=True)
                )
