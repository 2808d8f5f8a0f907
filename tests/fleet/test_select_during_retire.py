"""``select`` (``ensure INDEX``) while a retire empties a catalog class, and after one
killed midway: never "its entries are retired" for a model with live entries.

Retiring every device a class lists while it has more members first writes the class
as ``"devices": [], "more": true``; the catalog is rebuilt from the leaves only after the
leaf writes (for good when the retire is killed between the two). A device with no live
entry of its own found no candidate there and was told the model is retired (exit 2),
``ensure INDEX`` failed the same way; before and after the retire it got the portable
source. The class's members are now looked up in the leaves, a bounded number of nodes
(docs/fleet.md, "What select reads of a sharded index")."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import ConfigurationError, FormatError
from ptestore.fleet.index import create_index, open_index, publish_entries, update_index
from ptestore.fleet.index_nodes import device_bits
from ptestore.fleet.index_store import IndexStore
from ptestore.fleet.index_view import MAX_SCANNED
from ptestore.fleet.job import load_job
from ptestore.fleet.retire import retire_dropped
from ptestore.fleet.select import select
from ptestore.testing.fleet_index import device_name, synthetic_entry
from ptestore.writers import versions

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.fleet_backend:Scaler=1.0"
DEVICES = [f"dev{i:02d}" for i in range(12)]  # one class: a catalog lists 8 of them
KEPT = DEVICES[8:]  # the job drops the 8 the class lists


def _job(path: Path, dest: Path, devices: list[str], soc: str = "x") -> Path:
    """A job of model mlp on ``devices``, all of one SoC (one kind of build)."""
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "mlp"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        + "".join(
            f'[devices.{d}]\nsoc = "{soc}"\nscale = {1 + i / 8}\n' for i, d in enumerate(devices)
        )
    )
    return path


def _ran(tmp_path: Path) -> tuple[Path, str, Path]:
    """A real run of the 12 devices, a stranger gets the portable source, and the job
    then without the 8 listed; the job, the index's URL and the model's catalog."""
    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", out, DEVICES)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    url = str(out / "ptestore-index.json")
    _, sharded, _ = open_index(url)
    assert sharded is not None
    catalog = Path(sharded.catalog_url("mlp"))
    [cls] = json.loads(catalog.read_text())["classes"]
    assert (cls["devices"], cls["more"]) == (DEVICES[:8], True)
    assert select(url, "mlp", "newdev").kind == "source"
    _job(job, out, KEPT)
    return job, url, catalog


def _emptied(catalog: Path) -> bool:
    """Whether the catalog's one class lists no device while it has members."""
    [cls] = json.loads(catalog.read_text())["classes"]
    return cls["devices"] == [] and cls["more"] is True


def _live(url: str) -> set[str]:
    """The devices whose entry is live, read from the leaves."""
    _, sharded, _ = open_index(url)
    assert sharded is not None
    return {
        d
        for node in sharded.trie("mlp").walk()
        for d, e in node.entries.items()
        if not e.get("retired")
    }


def _stranger_gets_the_source(url: str, live: set[str]) -> None:
    choice = select(url, "mlp", "newdev")
    assert choice.kind == "source", choice.reason
    assert choice.pte["url"] == str(EXT.pte_path)
    assert choice.reason.startswith("no artifact of 'mlp' fits 'newdev' (dev")
    made_for = {c["made_for"] for c in choice.candidates}
    assert made_for and made_for <= live, (made_for, live)  # members, live in the leaves


# ----------------------------------------------------------------- while it runs


def test_select_while_a_retire_empties_a_class_finds_its_members_in_the_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hooked on the real retire (``fleet retire``'s call): after its first catalog
    write (the class emptied, the leaves not yet written) and before the rebuild (the
    leaves written), a stranger gets the portable source, the API and the CLI (was:
    exit 2, "its entries are retired"); a kept device its own build; after the retire,
    the same."""
    job, url, catalog = _ran(tmp_path)
    seen: list[tuple[bool, set[str]]] = []
    leaves: list[str] = []
    write = IndexStore.write

    def look() -> None:
        assert _emptied(catalog)
        live = _live(url)
        _stranger_gets_the_source(url, live)
        assert main(["select", url, "--model", "mlp", "--device", "newdev", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["kind"] == "source"
        assert select(url, "mlp", "dev10").made_for == "dev10"
        seen.append((bool(leaves), live))

    def hooked(self: IndexStore, target: str, *args: Any, **kw: Any) -> None:
        is_catalog = target == str(catalog)
        if is_catalog and leaves and len(seen) == 1:
            look()  # the leaves retired, the rebuild not begun
        write(self, target, *args, **kw)
        if not is_catalog:
            leaves.append(target)
        elif not seen:
            look()  # the class emptied, no leaf written yet

    monkeypatch.setattr(IndexStore, "write", hooked)
    retired = retire_dropped(load_job(job))  # fleet retire's own call
    monkeypatch.undo()
    assert sorted(r["device"] for r in retired.retired) == DEVICES[:8]
    assert seen == [(False, set(DEVICES)), (True, set(KEPT))]
    assert not _emptied(catalog)
    _stranger_gets_the_source(url, set(KEPT))
    assert [c["made_for"] for c in select(url, "mlp", "newdev").candidates] == KEPT


# ---------------------------------------------------------------- killed midway


def _killed(argv: list[str], before: Callable[[str, list[str]], bool]) -> None:
    """``ptestore ARGV`` in a forked child that ends (``os._exit(137)``, as a kill:
    nothing after it runs) just before the index write ``before(target, written)``
    picks (``written``: the objects written so far)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            written: list[str] = []
            write = IndexStore.write

            def dying(self: IndexStore, target: str, *args: Any, **kw: Any) -> None:
                if before(target, written):
                    sys.stderr.flush()
                    os._exit(137)
                write(self, target, *args, **kw)
                written.append(target)

            IndexStore.write = dying  # type: ignore[method-assign,assignment]  # child only
            code = main(argv)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137


def _after_the_first(target: str, written: list[str]) -> bool:
    return len(written) == 1


def _before_the_rebuild(target: str, written: list[str]) -> bool:
    return target.endswith("/catalog.json") and any(
        not w.endswith("/catalog.json") for w in written
    )


@pytest.mark.parametrize("kill", [_after_the_first, _before_the_rebuild])
def test_a_retire_killed_midway_leaves_strangers_the_portable_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kill: Callable[[str, list[str]], bool]
) -> None:
    """Killed right after its first write (the class emptied, its leaves live) or just
    before the rebuild (the leaves retired): select, and ensure INDEX, answer a stranger
    with the portable source, exit 0 (was: exit 2 until retire ran again, ensure not
    serving what it had cached); a kept device gets its own build; the retire run again
    rebuilds the catalog."""
    job, url, catalog = _ran(tmp_path)
    cache = str(tmp_path / "cache")
    ensure = ["ensure", url, "--cache-dir", cache, "--model", "mlp", "--device", "newdev"]
    assert main(ensure) == 0
    served = capsys.readouterr().out
    _killed(["fleet", "retire", str(job), "--json"], kill)
    assert _emptied(catalog)
    live = _live(url)
    assert live == (set(DEVICES) if kill is _after_the_first else set(KEPT))
    _stranger_gets_the_source(url, live)
    assert main(["select", url, "--model", "mlp", "--device", "newdev"]) == 0
    assert capsys.readouterr().out.startswith(f"source: {EXT.pte_path} + {EXT.ptd_path}\n")
    assert main(ensure) == 0
    assert capsys.readouterr().out == served  # the entry it made before
    assert select(url, "mlp", "dev10").made_for == "dev10"
    assert main(["fleet", "retire", str(job), "--json"]) == 0
    assert not _emptied(catalog)
    assert [c["made_for"] for c in select(url, "mlp", "newdev").candidates] == KEPT


def test_a_killed_retire_of_every_entry_says_retired_while_the_leaves_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job drops every device but one a run never reached (so the index holds no
    live entry of mlp): killed before the rebuild, the class still lists none with
    more; every leaf read holds no live entry, so "retired" is true, and said. Then a
    run of that device on another SoC killed before its catalog write (its live entry
    of a kind the catalog lacks): the leaves, all read, hold it, so no longer
    "retired": a stranger gets the portable source, the device its own build."""
    job, url, catalog = _ran(tmp_path)
    _job(job, tmp_path / "out", ["other"], soc="y")
    _killed(["fleet", "retire", str(job), "--json"], _before_the_rebuild)
    assert _emptied(catalog)
    assert _live(url) == set()
    capsys.readouterr()
    assert main(["select", url, "--model", "mlp", "--device", "newdev"]) == 2
    assert capsys.readouterr().err == (
        f"ptestore select: error: {url}: index has no model 'mlp' (its entries are retired: "
        "the job no longer names it) (models: mlp)\n"
    )
    _killed(["fleet", "run", str(job), "--workers", "1", "-q"], _before_the_rebuild)
    assert _emptied(catalog)
    assert _live(url) == {"other"}
    choice = select(url, "mlp", "newdev")
    assert (choice.kind, [c["made_for"] for c in choice.candidates]) == ("source", ["other"])
    assert select(url, "mlp", "other").made_for == "other"


# ------------------------------------------------------------------ the bound


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URL of every object read through ``read_versioned``, counted here."""
    seen: list[str] = []
    real = versions.read_versioned

    def counting(url: Any, **kw: Any) -> Any:
        got = real(url, **kw)
        seen.append(str(url))
        return got

    monkeypatch.setattr(versions, "read_versioned", counting)
    return seen


def _retire_killed_before_rebuild(
    monkeypatch: pytest.MonkeyPatch, url: str, kept: tuple[str, ...]
) -> None:
    """``update_index`` (retire's path) retiring every entry of ``url`` but those of the
    devices ``kept``, the process ending just before its catalog rebuild."""
    written: list[str] = []
    write = IndexStore.write

    class Killed(BaseException):
        """The process ends here: nothing after it runs."""

    def dying(self: IndexStore, target: str, *args: Any, **kw: Any) -> None:
        if _before_the_rebuild(target, written):
            raise Killed
        write(self, target, *args, **kw)
        written.append(target)

    monkeypatch.setattr(IndexStore, "write", dying)
    with pytest.raises(Killed):
        update_index(
            url, lambda e: None if e["device"] in kept else {**e, "retired": {"reason": "x"}}
        )
    monkeypatch.undo()


def test_members_not_found_within_the_bound_are_said_so_not_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 devices of one kind of build in leaves of 1 KiB, all but one far from a
    stranger's path retired by ``update_index`` (retire's path) stopped before its
    rebuild: the stranger's look-up reads at most MAX_SCANNED nodes off its own path,
    finds no member, and says so (pointing to check-index --repair), never "retired";
    a device whose own path leads to the member finds it."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=1024)
    names = [device_name(i) for i in range(64)]
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in names], {})
    last = max(names[8:], key=device_bits)  # not listed; "0" halves are read first
    stranger = next(f"s{i}" for i in range(1000) if device_bits(f"s{i}")[:2] == "00")
    _, sharded, _ = open_index(url)
    assert sharded is not None
    catalog = sharded.catalog_url("m")
    _retire_killed_before_rebuild(monkeypatch, url, (last,))
    [cls] = json.loads(Path(catalog).read_text())["classes"]
    assert (cls["devices"], cls["more"]) == ([], True)
    _, leaf = sharded.trie("m").find(last, 0, 0)  # as the retire's splits left it
    prefix = leaf.rsplit("/t", 1)[-1].removesuffix(".json")
    assert len(prefix) >= 4 and not device_bits(stranger).startswith(prefix[:2])
    seen = _count_reads(monkeypatch)
    with pytest.raises(ConfigurationError) as err:
        select(url, "m", stranger)
    assert str(err.value) == (
        f"{url}: the catalog of model 'm' lists no device of 1 kind(s) of build that have "
        "live members (a retire is taking them out of it, or was stopped before it rebuilt "
        f"it from the leaves), and the first {MAX_SCANNED} nodes of its leaves read hold "
        f"none of them: run again, and if it persists: ptestore fleet check-index {url} "
        "--repair rebuilds the catalog from the leaves"
    )
    bits = device_bits(stranger)
    path = {bits[:k] for k in range(257)} | {bits[: k - 1] + "10"[int(bits[k - 1])]
                                             for k in range(1, 257)}  # fmt: skip
    nodes = [u.rsplit("/t", 1)[-1].removesuffix(".json") for u in seen if "/m/" in u]
    off_path = [p for p in nodes if p not in path and not p.startswith("atalog")]
    assert 0 < len(off_path) <= MAX_SCANNED, off_path
    near = next(f"n{i}" for i in range(100_000) if device_bits(f"n{i}").startswith(prefix))
    choice = select(url, "m", near)
    assert (choice.kind, [c["made_for"] for c in choice.candidates]) == ("source", [last])


def test_a_lost_half_is_never_read_as_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leaves searched for an emptied class's members: a half its split node names,
    found missing, is a FormatError (a lost leaf), as every other reader says; it was
    read as empty, and with no other live entry the model was said retired (and
    ``ensure INDEX`` would record that for every profile of the device)."""
    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=4096)
    names = [device_name(i) for i in range(9)]
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in names], {})
    last = names[8]  # not listed in the catalog (8 names a class)
    _, sharded, _ = open_index(url)
    assert sharded is not None
    _retire_killed_before_rebuild(monkeypatch, url, (last,))
    _, leaf = sharded.trie("m").find(last, 0, 0)
    prefix = leaf.rsplit("/t", 1)[-1].removesuffix(".json")
    assert prefix  # a half below a split
    os.unlink(leaf)
    strangers = [f"s{i}" for i in range(40)]
    for stranger in strangers:
        with pytest.raises(FormatError) as err:
            select(url, "m", stranger)
        assert "a leaf is missing" in str(err.value), (stranger, str(err.value))


def test_kinds_not_found_are_no_answer_even_beside_rated_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An emptied class whose members lie beyond the bound, beside builds of another
    kind that do not fit the device: the look-up says it found no member (the error of
    the test above), never the portable source (which ``ensure INDEX`` would record as
    the index's answer): the build it did not rate might fit."""
    from ptestore.backends import register_backend, unregister_backend
    from ptestore.backends.compat import DeviceProfile
    from ptestore.testing.fleet_index import SocBackend, soc_of

    url = str(tmp_path / "ptestore-index.json")
    create_index(url, leaf_bytes=1024)
    names = [n for n in (device_name(i) for i in range(200)) if soc_of(n, 2) == "soc0"][:64]
    others = [n for n in (f"yy{i}" for i in range(100)) if soc_of(n, 2) == "soc1"][:2]
    entries = [synthetic_entry("m", d, socs=2) for d in names + others]
    publish_entries(url, entries, {})
    last = max(names[8:], key=device_bits)
    stranger = next(f"s{i}" for i in range(1000) if device_bits(f"s{i}")[:2] == "00")
    _retire_killed_before_rebuild(monkeypatch, url, (last, *others))
    monkeypatch.setattr("ptestore.fleet.index_view.MAX_SCANNED", 0)  # a fleet past the bound
    register_backend(SocBackend, "synthetic-npu")
    try:
        device = DeviceProfile(stranger, {"soc": "soc0", "sdk": "2.31", "memory_mb": 8192})
        with pytest.raises(ConfigurationError, match="lists no device of 1 kind"):
            select(url, "m", device)
    finally:
        unregister_backend("synthetic-npu")
