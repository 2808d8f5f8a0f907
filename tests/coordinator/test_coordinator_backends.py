"""Misbehaving backends and silent no-ops.

- anything a backend raises (``SystemExit`` at import or in the call, a custom
  ``BaseException``, an exception whose ``__str__`` raises) is a ``BackendError``; only
  ``KeyboardInterrupt`` goes through;
- ``initialize_backend_data`` written as a generator or ``async def`` is refused, and
  the context, writer and named data map are dead once the call returned;
- the default selection uses every installed backend whose ``name`` is an id of the
  program, whatever its entry point is called;
- a run that specializes nothing says why (``strict=True`` raises
  ``NothingSpecialized``); the report names backends by spec and records what each
  publish returned;
- a backend's ``version`` is read once per run, before its call, and that one value is
  recorded in ``requested`` and ``backends`` of every record of the run (a version that
  changed between reads gave a record saying two versions, stale at once).
"""

from __future__ import annotations

import gc
import json
import pickle
import re
import sys
import textwrap
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from support.fixtures import get_fixture

import ptestore
from ptestore.backends import (
    BackendData,
    BackendDataInitContext,
    BackendDataWriter,
    BackendInterface,
    NotSupported,
    load_backend,
    register_backend,
    unregister_backend,
)
from ptestore.backends.registry import InstalledBackend, declared_backends, installed_backends
from ptestore.coordinator import Event
from ptestore.coordinator.report import nothing_specialized_message
from ptestore.errors import (
    BackendError,
    ConfigurationError,
    NothingSpecialized,
    WriterStateError,
)
from ptestore.format import parse
from ptestore.provenance import read_provenance
from ptestore.storage.loaders import open_loader
from ptestore.writers import open_writer

MLP = get_fixture("mlp_xnnpack")
EXT = get_fixture("mlp_xnnpack_ext")
PORTABLE = get_fixture("mlp_portable")
assert MLP.pte_path is not None
KEYS = [e["key"] for e in MLP.facts["pte"]["named_data"]]
KEY_SEGMENT = {e["key"]: e["segment_index"] for e in MLP.facts["pte"]["named_data"]}


class Backend(BackendInterface):
    """Serves ``name``; visits every input, then runs ``action(context, output)``."""

    def __init__(self, name: str = "XnnpackBackend", action: Any = None) -> None:
        self.name = name
        self.action = action

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for _ in context:
            pass
        if self.action is not None:
            self.action(context, output)


LABEL = f"{Backend.__module__}:{Backend.__qualname__}"


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    p = tmp_path / "out.pte"
    p.write_bytes(b"previous content")
    return p


def segment(data: bytes, index: int) -> bytes:
    c = parse(data, len(data), "x")
    s = c.segments[index]
    return data[c.segment_base_offset + s.offset :][: s.size]


def fails(src: Path, dst: Path, backends: list[Any], pattern: str) -> BackendError:
    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, dst, backends=backends)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert dst.read_bytes() == b"previous content"
    assert src.read_bytes() == MLP.pte_path.read_bytes()  # type: ignore[union-attr]
    return info.value


class Plugins:
    """Backend modules and entry points installed for one test, as a real
    distribution would install them (a ``.dist-info`` on ``sys.path``)."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.root.mkdir()
        monkeypatch.syspath_prepend(str(root))
        self._eps: list[str] = []

    def module(self, source: str) -> str:
        name = f"ptestore_plugin_{uuid.uuid4().hex[:12]}"
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    def entry_point(self, name: str, value: str) -> None:
        self._eps.append(f"{name} = {value}")
        info = self.root / "ptestore_test_plugins-1.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: ptestore-test-plugins\nVersion: 1.0\n"
        )
        (info / "entry_points.txt").write_text(
            "[ptestore.backends]\n" + "\n".join(self._eps) + "\n"
        )


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plugins:
    return Plugins(tmp_path / "site", monkeypatch)


BF16 = f"""
    from ptestore.backends import BackendData, BackendInterface

    class Bf16Round(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context, output):
            output.write_named_data({KEYS[3]!r}, BackendData(b"\\x07" * 32))
    """


# ------------------------------------------------------------------ 13.5 escapes
class Escape(BaseException):
    pass


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (SystemExit(0), "SystemExit: 0"),
        (SystemExit(), "SystemExit"),
        (Escape("out of here"), "Escape: out of here"),
        (GeneratorExit(), "GeneratorExit"),
        (Hostile(), "Hostile (its message could not be read: RuntimeError)"),
    ],
)
def test_anything_a_backend_raises_is_a_backend_error(
    src: Path, dst: Path, exc: BaseException, text: str
) -> None:
    def action(ctx: Any, out: Any) -> None:
        raise exc

    err = fails(
        src,
        dst,
        [Backend(action=action)],
        rf"backend 'XnnpackBackend' \(coordinator\.test_coordinator_backends:[\w.<>]+\), method "
        rf"'forward': initialize_backend_data failed: "
        rf"{re.escape(text)}",
    )
    assert err.__cause__ is exc


def test_keyboard_interrupt_still_interrupts(src: Path, dst: Path) -> None:
    def action(ctx: Any, out: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ptestore.specialize(src, dst, backends=[Backend(action=action)])
    assert dst.read_bytes() == b"previous content"


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
        ("raise ValueError('no NPU driver')\n", "ValueError: no NPU driver"),
        (
            "class Hostile(Exception):\n    def __str__(self):\n        raise RuntimeError\n"
            "raise Hostile()\n",
            "Hostile (its message could not be read: RuntimeError)",
        ),
    ],
)
def test_module_raising_at_import(
    plugins: Plugins, src: Path, dst: Path, body: str, text: str
) -> None:
    mod = plugins.module(body)
    fails(
        src,
        dst,
        [f"{mod}:Backend"],
        rf"backend '{mod}:Backend': importing module '{mod}' failed: {re.escape(text)}",
    )


def test_module_import_error_is_a_configuration_error(plugins: Plugins) -> None:
    mod = plugins.module("import ptestore_no_such_dependency\n")
    with pytest.raises(ConfigurationError) as info:
        load_backend(f"{mod}:Backend")
    assert str(info.value) == (
        f"backend '{mod}:Backend': cannot import '{mod}': "
        "No module named 'ptestore_no_such_dependency'"
    )


def test_factories_and_constructors_that_raise(plugins: Plugins, src: Path, dst: Path) -> None:
    mod = plugins.module(
        """
        import sys
        from ptestore.backends import BackendInterface

        def make():
            raise RuntimeError("no device attached")

        class Quits(BackendInterface):
            name = "XnnpackBackend"

            def __init__(self):
                sys.exit(3)
        """
    )
    fails(
        src,
        dst,
        [f"{mod}:make"],
        rf"backend '{mod}:make': constructing {mod}:make failed: RuntimeError: "
        r"no device attached",
    )
    fails(
        src,
        dst,
        [f"{mod}:Quits"],
        rf"backend '{mod}:Quits': constructing {mod}:Quits failed: SystemExit: 3",
    )


def test_entry_point_raising_at_import(plugins: Plugins, src: Path, dst: Path) -> None:
    mod = plugins.module("raise SystemExit(0)\n")
    plugins.entry_point("broken", f"{mod}:Backend")
    pattern = rf"backend 'broken': entry point '{mod}:Backend' failed to load: SystemExit: 0"
    fails(src, dst, ["broken"], pattern)
    # The default selection cannot know what a broken backend serves: it says so.
    with pytest.raises(BackendError) as info:
        ptestore.specialize(src, dst)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    (broken,) = [i for i in installed_backends() if i.name == "broken"]
    assert broken.error is not None and broken.error.endswith("failed to load: SystemExit: 0")
    assert dst.read_bytes() == b"previous content"


def test_command_spec_with_unbalanced_quotes() -> None:
    with pytest.raises(ConfigurationError) as info:
        load_backend("command@XnnpackBackend=python3 'pack.py --level 2")
    assert str(info.value) == (
        'the command backend cannot parse its command line "python3 \'pack.py --level 2": '
        "No closing quotation (close every quote; quote or escape arguments that contain "
        "spaces)"
    )


# ------------------------------------------------------------------ 13.6 the call
def test_generator_function_is_refused(src: Path, dst: Path) -> None:
    class Gen(BackendInterface):
        name = "XnnpackBackend"

        def initialize_backend_data(self, context: Any, output: Any) -> Iterator[None]:  # type: ignore[override]
            output.write_named_data(KEYS[0], BackendData(b"\0" * 2048))
            yield

    fails(
        src,
        dst,
        [Gen()],
        r"backend 'XnnpackBackend' \(coordinator\.test_coordinator_backends:[\w.<>]+\): "
        r"initialize_backend_data returned a generator \(is "
        r"initialize_backend_data a generator function\?\), so its body never ran: it must do "
        r"its work during the call and return None",
    )


def test_async_def_is_refused_without_a_never_awaited_warning(src: Path, dst: Path) -> None:
    class Async(BackendInterface):
        name = "XnnpackBackend"

        async def initialize_backend_data(self, context: Any, output: Any) -> None:  # type: ignore[override]
            output.write_named_data(KEYS[0], BackendData(b"\0" * 2048))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fails(
            src,
            dst,
            [Async()],
            r"backend 'XnnpackBackend' \(coordinator\.test_coordinator_backends:[\w.<>]+\): "
            r"initialize_backend_data returned a coroutine or "
            r"awaitable \(is initialize_backend_data an async def\?\), so its body never ran: "
            r"it must do its work during the call and return None",
        )
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


def test_async_generator_is_refused(src: Path, dst: Path) -> None:
    class AsyncGen(BackendInterface):
        name = "XnnpackBackend"

        async def initialize_backend_data(self, context: Any, output: Any) -> Any:  # type: ignore[override]
            yield

    fails(
        src,
        dst,
        [AsyncGen()],
        r"backend 'XnnpackBackend' \(coordinator\.test_coordinator_backends:[\w.<>]+\): "
        r"initialize_backend_data returned an async generator, so "
        r"its body never ran: it must do its work during the call and return None",
    )


def dead(what: str) -> str:
    return (
        f"backend 'XnnpackBackend': {what} used after initialize_backend_data returned; the "
        "context, writer and named data map a backend gets are valid only during that call"
    )


@pytest.mark.parametrize("declines", [False, True])
def test_context_writer_and_map_are_dead_after_the_call(
    src: Path, dst: Path, declines: bool
) -> None:
    kept: dict[str, Any] = {}

    def action(ctx: Any, out: Any) -> None:
        kept.update(ctx=ctx, out=out, map=ctx.get_named_data_map())
        if declines:
            raise NotSupported("not today")

    report = ptestore.specialize(
        src, dst, backends=[Backend(action=action)], allow_unchanged=True, provenance=False
    )
    ctx, out, named = kept["ctx"], kept["out"], kept["map"]
    uses: list[tuple[Callable[[], object], str]] = [
        (lambda: out.write_named_data(KEYS[0], BackendData(b"\0" * 2048)), "write_named_data"),
        (lambda: out.write_named_data({KEYS[0]: BackendData(b"")}), "write_named_data"),
        (lambda: out.write_processed_data(BackendData(b"x")), "write_processed_data"),
        (ctx.next_backend_data, "next_backend_data"),
        (lambda: list(ctx), "next_backend_data"),
        (ctx.get_named_data_map, "get_named_data_map"),
        (lambda: ctx.backend_id, "context.backend_id"),
        (lambda: ctx.replaced_keys, "context.replaced_keys"),
        (lambda: named.get_data(KEYS[0]), "named_data_map.get_data"),
        (lambda: named.get_tensor_layout(KEYS[0]), "named_data_map.get_tensor_layout"),
        (lambda: named.get_tensor_info(KEYS[0]), "named_data_map.get_tensor_info"),
        (lambda: named.get_shared_keys(KEYS[0]), "named_data_map.get_shared_keys"),
        (named.keys, "named_data_map.keys"),
        (lambda: len(named), "len() of the named data map"),
        (lambda: KEYS[0] in named, "'in' on the named data map"),
        (lambda: list(named), "iterating the named data map"),
    ]
    for use, what in uses:
        with pytest.raises(WriterStateError) as info:
            use()
        assert str(info.value) == dead(what)
    assert report.backends[0].bytes_out == 0
    assert dst.read_bytes() == src.read_bytes()


def test_writes_from_a_thread_after_the_call_are_refused_and_not_counted(
    src: Path, dst: Path
) -> None:
    returned = threading.Event()
    errors: list[BaseException] = []

    def late(out: Any) -> None:
        returned.wait(120)  # an event: the ceiling only for a hang
        try:
            out.write_named_data(KEYS[1], BackendData(b"\x09" * 128))
        except BaseException as exc:
            errors.append(exc)

    threads: list[threading.Thread] = []

    def action(ctx: Any, out: Any) -> None:
        out.write_named_data(KEYS[3], BackendData(b"\x05" * 32))
        t = threading.Thread(target=late, args=(out,))
        t.start()
        threads.append(t)

    def tracer(event: Event) -> None:
        if event.kind == "backend_end":  # the call has returned; the run goes on
            returned.set()
            threads[0].join(120)

    report = ptestore.specialize(src, dst, backends=[Backend(action=action)], event_tracer=tracer)
    assert [str(e) for e in errors] == [dead("write_named_data")]
    (b,) = report.backends
    assert (b.keys_replaced, b.bytes_out) == ([KEYS[3]], 32)
    out = dst.read_bytes()
    assert segment(out, KEY_SEGMENT[KEYS[3]]) == b"\x05" * 32
    assert segment(out, KEY_SEGMENT[KEYS[1]]) == segment(src.read_bytes(), KEY_SEGMENT[KEYS[1]])


# ------------------------------------------------------------------ 8.3 selection
def test_default_selection_by_the_backends_name(plugins: Plugins, src: Path, dst: Path) -> None:
    """An entry point ``bf16 = mod:Bf16Round`` whose ``name`` is ``XnnpackBackend``
    serves XnnpackBackend by default."""
    mod = plugins.module(BF16)
    plugins.entry_point("bf16", f"{mod}:Bf16Round")
    report = ptestore.specialize(src, dst)
    (b,) = report.backends
    assert (b.backend_id, b.implementation, b.status) == ("XnnpackBackend", "bf16", "specialized")
    assert report.specialized
    assert segment(dst.read_bytes(), KEY_SEGMENT[KEYS[3]]) == b"\x07" * 32
    # the version provenance records: the distribution providing the module (none
    # lists this one's file), not the one declaring the entry point (1.0)
    assert (
        InstalledBackend("bf16", "XnnpackBackend", f"{mod}:Bf16Round", "entry point", "unknown")
        in installed_backends()
    )
    assert load_backend("bf16").version == "unknown"


def test_generic_backend_installed_under_an_id_serves_it(
    plugins: Plugins, src: Path, dst: Path
) -> None:
    plugins.entry_point("XnnpackBackend", "ptestore.backends.passthrough:PassthroughBackend")
    report = ptestore.specialize(src, dst)
    (b,) = report.backends
    assert (b.implementation, b.status, b.inputs_seen) == ("XnnpackBackend", "specialized", 1)


def test_registered_backend_is_chosen_by_its_name(src: Path, dst: Path) -> None:
    register_backend(Backend(), "my-npu")
    try:
        report = ptestore.specialize(src, dst, allow_unchanged=True)
    finally:
        unregister_backend("my-npu")
    assert (report.backends[0].implementation, report.backends[0].status) == (
        "my-npu",
        "not_supported",  # it wrote nothing: it declined
    )


def test_two_installed_backends_for_one_id_are_refused(
    plugins: Plugins, src: Path, dst: Path
) -> None:
    mod = plugins.module(BF16)
    plugins.entry_point("bf16", f"{mod}:Bf16Round")
    plugins.entry_point("other", f"{mod}:Bf16Round")
    with pytest.raises(ConfigurationError) as info:
        ptestore.specialize(src, dst)
    assert str(info.value) == (
        "backend id 'XnnpackBackend' is served by two installed backends, 'bf16' and "
        "'other'; choose one with backends=[...] (CLI: --backend)"
    )
    assert dst.read_bytes() == b"previous content"


# ------------------------------------------------------------------ 8.4 no silent no-op
def installed_text() -> str:
    return "; ".join(declared_backends())


def strict_refuses(src: Path, dst: Path, message: str, **kwargs: Any) -> NothingSpecialized:
    dst.write_bytes(b"previous content")
    with pytest.raises(NothingSpecialized) as info:
        ptestore.specialize(src, dst, strict=True, **kwargs)
    assert str(info.value) == message
    assert isinstance(info.value, ConfigurationError)
    assert dst.read_bytes() == b"previous content"
    return info.value


def test_nothing_installed_for_the_program(src: Path, dst: Path) -> None:
    report = ptestore.specialize(src, dst, allow_unchanged=True)
    hint = (
        "Install or register a backend whose name is one of these ids, or name one "
        "explicitly (backends=[...]; CLI: --backend)."
    )
    message = (
        f"nothing was specialized in {src}: no installed backend serves a backend id of the "
        f"program. Backend ids in the program: XnnpackBackend. Installed backends: "
        f"{installed_text()}. {hint}"
    )
    assert "passthrough (ptestore.backends.passthrough:PassthroughBackend)" in message
    assert (report.specialized, report.hint) == (False, hint)
    assert nothing_specialized_message(report) == message
    assert report.to_dict()["specialized"] is False
    err = strict_refuses(src, dst, message)
    assert (err.backend_ids, err.hint) == (("XnnpackBackend",), hint)
    assert pickle.loads(pickle.dumps(err)).backend_ids == ("XnnpackBackend",)


def test_why_nothing_was_specialized_imports_no_installed_backend(
    plugins: Plugins, src: Path, dst: Path
) -> None:
    """The message lists the installed backends from the metadata: it imported every
    one (3.2 s against 0.28 s with a heavy SDK, and a vendor's import-time code ran,
    a ``sys.exit`` at import included)."""
    vendor = plugins.module("class Npu:\n    name = 'VendorNpuBackend'\n")
    plugins.entry_point("vendor-npu", f"{vendor}:Npu")
    exits = plugins.module("import sys\nsys.exit('imported for an error message')\n")
    plugins.entry_point("vendor-exits", f"{exits}:Npu")
    registered = Backend("VendorNpuBackend")
    register_backend(registered, "vendor-registered")
    try:
        report = ptestore.specialize(
            src, dst, backends=[Backend("OtherBackend")], allow_unchanged=True
        )
    finally:
        unregister_backend("vendor-registered")
    assert vendor not in sys.modules  # never imported
    assert f"vendor-npu ({vendor}:Npu)" in report.installed_backends
    assert f"vendor-exits ({exits}:Npu)" in report.installed_backends
    assert f"vendor-registered ({LABEL}, serves 'VendorNpuBackend')" in (report.installed_backends)
    message = nothing_specialized_message(report) or ""
    assert f"Installed backends: {'; '.join(report.installed_backends)}." in message


def test_backend_given_serves_no_id(src: Path, dst: Path) -> None:
    report = ptestore.specialize(
        src,
        dst,
        backends=[Backend("VendorNpuBackend")],
        allow_unchanged=True,
    )
    assert report.unchanged_reason == (
        f"the backends given serve no backend id of the program: {LABEL} (serves "
        "'VendorNpuBackend')"
    )
    assert report.hint == "Use SPEC@BACKEND_ID to make a backend serve a given id."
    assert report.unused_backends == ["VendorNpuBackend"]
    strict_refuses(
        src, dst, nothing_specialized_message(report) or "", backends=[Backend("VendorNpuBackend")]
    )


def test_every_backend_declined(src: Path, dst: Path) -> None:
    def decline(ctx: Any, out: Any) -> None:
        raise NotSupported("wrong device")

    report = ptestore.specialize(src, dst, backends=[Backend(action=decline)], allow_unchanged=True)
    assert report.unchanged_reason == (
        f"every backend declined ('XnnpackBackend': {LABEL} declined: wrong device)"
    )
    assert report.hint is None


def test_external_weights_without_the_ptd_hint_pass_ptd(tmp_path: Path) -> None:
    assert EXT.pte_path is not None

    def decline(ctx: Any, out: Any) -> None:
        named = ctx.get_named_data_map()
        if not named.keys():
            raise NotSupported("no weights to pack")
        key = sorted(named.keys())[0]
        out.write_named_data(key, BackendData(bytes(named.get_data(key))))

    dst = tmp_path / "o.pte"
    dst.write_bytes(b"previous content")
    hint = (
        "The .pte holds no named data of its own: if this program keeps its weights in a "
        ".ptd, pass it (CLI: --ptd SRC_PTD DST_PTD; Python: ptd=(src, dst))."
    )
    err = strict_refuses(
        EXT.pte_path,
        dst,
        f"nothing was specialized in {EXT.pte_path}: every backend declined "
        f"('XnnpackBackend': {LABEL} declined: no weights to pack). Backend ids in the program: "
        f"XnnpackBackend. Installed backends: {installed_text()}. {hint}",
        backends=[Backend(action=decline)],
    )
    assert err.hint == hint
    # With its .ptd the same backend has weights and the run specializes.
    assert EXT.ptd_path is not None
    report = ptestore.specialize(
        EXT.pte_path,
        tmp_path / "o2.pte",
        ptd=(EXT.ptd_path, tmp_path / "o2.ptd"),
        backends=[Backend(action=decline)],
        strict=True,
    )
    assert report.specialized


def test_passthrough_named_explicitly_is_a_deliberate_copy(tmp_path: Path) -> None:
    assert PORTABLE.pte_path is not None
    dst = tmp_path / "o.pte"
    report = ptestore.specialize(
        PORTABLE.pte_path, dst, backends=["passthrough"], strict=True, provenance=False
    )
    assert (report.specialized, report.backends) == (True, [])
    assert dst.read_bytes() == PORTABLE.pte_path.read_bytes()
    report = ptestore.specialize(PORTABLE.pte_path, dst, allow_unchanged=True, provenance=False)
    assert report.unchanged_reason == (
        "the program has no delegates, so no backend has anything to do"
    )
    # passthrough for an id the program does not have is a typo, not a request.
    assert MLP.pte_path is not None
    report = ptestore.specialize(
        MLP.pte_path,
        dst,
        backends=["passthrough@XnnpackBackendd"],
        allow_unchanged=True,
        provenance=False,
    )
    assert report.unchanged_reason == (
        "the backends given serve no backend id of the program: passthrough@XnnpackBackendd "
        "(serves 'XnnpackBackendd')"
    )


def test_strict_in_the_low_level_api_publishes_nothing() -> None:
    assert MLP.pte_path is not None
    fs = fsspec.filesystem("memory")
    fs.pipe("/strict-test/out.pte", b"old")
    loader = open_loader(MLP.pte_path)
    try:
        with pytest.raises(NothingSpecialized, match=r"^nothing was specialized in "):
            ptestore.initialize_and_save_backend_data(
                loader, open_writer("memory://strict-test/out.pte"), strict=True
            )
    finally:
        loader.close()
    assert fs.cat_file("/strict-test/out.pte") == b"old"


# ------------------------------------------------------------------ 8.7 reports
def test_report_names_specs_and_records_publish_results(src: Path, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    report = ptestore.specialize(
        src,
        "memory://report-test/o.pte",
        backends=[Backend()],
        allow_unchanged=True,
        provenance=False,
    )
    assert report.backends[0].implementation == LABEL
    (f,) = report.files
    published = fs.cat_file("/report-test/o.pte")
    assert f.published_size == len(published) == f.size_after
    assert f.etag is not None  # the memory writer's version token
    text = json.dumps(report.to_dict())
    assert "0x" not in text and " object at " not in text
    assert {"etag", "version_id", "checksum", "published_size"} <= set(report.to_dict()["files"][0])

    report = ptestore.specialize(
        src,
        tmp_path / "o.pte",
        backends=["passthrough"],
        allow_unchanged=True,
        provenance=False,
    )
    assert report.backends[0].implementation == "passthrough"
    assert (report.files[0].published_size, report.files[0].etag) == (
        (tmp_path / "o.pte").stat().st_size,
        None,
    )
    report = ptestore.specialize(
        src, tmp_path / "o.pte", backends=[Backend], allow_unchanged=True, provenance=False
    )
    assert report.backends[0].implementation == LABEL


def test_cli_does_not_exit_0_on_a_backend_sys_exit(
    plugins: Plugins, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specialize ... && deploy`` must not go on: a ``sys.exit(0)`` at import or in
    the call is a failure with a message."""
    from ptestore.cli import main

    at_import = plugins.module("import sys\nsys.exit(0)\n")
    in_call = plugins.module(
        """
        import sys
        from ptestore.backends import BackendInterface

        class Quits(BackendInterface):
            name = "XnnpackBackend"

            def initialize_backend_data(self, context, output):
                sys.exit(0)
        """
    )
    out = tmp_path / "o.pte"
    for spec, text in (
        (
            f"{at_import}:X",
            f"backend '{at_import}:X': importing module '{at_import}' failed: SystemExit: 0",
        ),
        (
            f"{in_call}:Quits",
            f"backend 'XnnpackBackend' ({in_call}:Quits): initialize_backend_data failed: "
            "SystemExit: 0",
        ),
    ):
        assert main(["specialize", str(src), str(out), "--backend", spec, "--quiet"]) == 1
        assert text in capsys.readouterr().err
        assert not out.exists()


# ------------------------------------------------------------------ one version per run
class VersionChanges(Backend):
    """A version that differs on each read (a clock, a counter, an SDK queried anew)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    @property
    def version(self) -> str:  # type: ignore[override]
        self.reads += 1
        return f"1.{self.reads - 1}"


class LazyVersion(Backend):
    """``"sdk-unknown"`` until its call loads the SDK."""

    sdk: str | None = None

    def __init__(self) -> None:
        super().__init__(action=lambda context, output: self.load_sdk(context, output))

    def load_sdk(self, context: BackendDataInitContext, output: BackendDataWriter) -> None:
        self.sdk = "sdk-2.0"
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))

    @property
    def version(self) -> str:  # type: ignore[override]
        return self.sdk or "sdk-unknown"


def _versions(path: Path) -> tuple[list[str], list[str]]:
    loader = open_loader(str(path))
    try:
        record = read_provenance(loader)
    finally:
        loader.close()
    assert record is not None
    return [r.version for r in record.requested], [b.version for b in record.backends]


def test_a_run_reads_a_backends_version_once_and_records_it_everywhere(
    tmp_path: Path,
) -> None:
    assert EXT.pte_path is not None and EXT.ptd_path is not None
    changes = VersionChanges()
    changes.action = LazyVersion().load_sdk  # replaces something: a run with two records
    out, out_ptd = tmp_path / "o.pte", tmp_path / "o.ptd"
    ptestore.specialize(
        EXT.pte_path, out, ptd=(EXT.ptd_path, out_ptd), backends=[changes], provenance=True
    )
    assert changes.reads == 1
    assert _versions(out) == _versions(out_ptd) == (["1.0"], ["1.0"])


@pytest.mark.parametrize("given", [True, False], ids=["given", "default-selection"])
def test_the_version_recorded_is_the_one_read_before_the_call(
    src: Path, tmp_path: Path, given: bool
) -> None:
    """What a fresh instance reports, which is what verify, a fleet plan and the device
    cache compare (the kit fails a backend whose version changes during its call)."""
    lazy = LazyVersion()
    if given:
        ptestore.specialize(src, tmp_path / "o.pte", backends=[lazy])
    else:
        register_backend(lazy, "lazy-version")
        try:
            ptestore.specialize(src, tmp_path / "o.pte")
        finally:
            unregister_backend("lazy-version")
    assert lazy.sdk == "sdk-2.0"  # it ran
    assert _versions(tmp_path / "o.pte") == (["sdk-unknown"] if given else [], ["sdk-unknown"])
