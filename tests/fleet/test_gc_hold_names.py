"""A hold's name when ``<object>.ptestore-hold`` is too long for its store
(:func:`ptestore.fleet.holds.hold_url`): a local object whose name is within 14 bytes
of NAME_MAX (255), an S3 object whose key is within 14 bytes of S3's 1024. Its hold
used to fail (``File name too long``), failing the pair that reused it; now it is
``<head>~<digest><kind>.ptestore-hold``, which the run writes and gc finds."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import StorageError
from ptestore.fleet.holds import HOLD_SUFFIX, NAME_MAX, S3_KEY_MAX, hold, hold_url, is_hold
from ptestore.fleet.index import find_entry
from ptestore.testing.s3server import S3TestServer

EXT = get_fixture("mlp_xnnpack_ext")
SPEC = "support.hanging_backend:Hanging=1.0"
THREE = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n[devices.d2]\nscale = 2.0\n'
TWO = '[devices.d0]\nsoc = "s0"\n[devices.d1]\nsoc = "s1"\n'
WEEK = 7 * 86400
MONTH = 30 * 86400
#: A model whose ``.pte`` is 250 bytes long: its plain hold name would be 264.
MODEL = "m" * 246


def _job(path: Path, dest: str, devices: str) -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\nbackends = ["{SPEC}"]\n'
        f'[[models]]\nname = "{MODEL}"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
        + devices
    )
    return path


def _backdate_tree(root: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))


def _gc(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[str, str]]:
    """gc's ``(kind, action)`` by location under the job's output."""
    assert main(["gc", *argv, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return {e["location"]: (e["kind"], e["action"]) for e in report["entries"]}


def test_a_reused_object_with_a_long_name_is_held_and_gc_honours_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """d2 retired, a month old, named again: its ``<246 m>.pte`` is held under the
    shortened name (it used to fail the pair: ``cannot be held ... File name too
    long``); gc keeps it held within the grace, and removes the hold, kind ``hold``,
    once older than the grace."""
    from ptestore.fleet import load_job, plan_job, run_plan
    from ptestore.fleet.reuse import hold_reused

    out = tmp_path / "out"
    job = _job(tmp_path / "job.toml", str(out), THREE)
    assert main(["fleet", "run", str(job), "--workers", "1", "-q"]) == 0
    _job(job, str(out), TWO)
    assert main(["fleet", "retire", str(job)]) == 0
    capsys.readouterr()
    _backdate_tree(out, MONTH)
    _job(job, str(out), THREE)
    plan = plan_job(load_job(job))
    [d2] = [p for p in plan.pairs if p.pair.device.name == "d2"]
    assert d2.action == "skip"
    assert hold_reused(plan) == 2  # its .pte and its scaled shared .ptd
    assert d2.action == "skip", d2.reason
    pte = out / "d2" / f"{MODEL}.pte"
    digest = hashlib.sha256(pte.name.encode()).hexdigest()[:32]
    [held] = (out / "d2").glob(f"*{HOLD_SUFFIX}")
    assert held.name == "m" * 204 + f"~{digest}.pte{HOLD_SUFFIX}"
    assert len(held.name) == NAME_MAX and is_hold(held.name)
    assert str(held) == hold_url(str(pte))
    assert json.loads(held.read_bytes())["object"] == str(pte)

    acts = _gc([str(out), "--grace", "7d"], capsys)
    assert acts[str(pte)] == ("artifact", f"skipped: a run held it within the grace of {WEEK}s")
    assert acts[str(held)] == ("hold", f"skipped: younger than the grace of {WEEK}s")
    assert not any(a == "removed" for _, a in acts.values()), acts

    result = run_plan(plan, workers=1)
    assert [(p.device, p.status) for p in result.pairs] == [
        ("d0", "skipped"), ("d1", "skipped"), ("d2", "skipped"),
    ]  # fmt: skip
    assert result.exit_code == 0, result.index_error
    entry = find_entry(str(out / "ptestore-index.json"), MODEL, "d2")
    assert entry is not None and not entry.get("retired")

    _backdate_tree(out, WEEK + 60)
    acts = _gc(["--job", str(job)], capsys)
    assert acts[str(held)] == ("hold", "removed")
    assert {k for _, (k, _) in acts.items()} == {"hold"}
    assert not held.exists() and pte.exists()


@pytest.mark.parametrize(
    "name",
    ["a" * 241 + ".pte", "a" * 231 + ".xpwc.json", "é" * 120 + ".ptd", "a" * 237 + ".pte"],
)
def test_a_hold_name_fits_under_name_max(tmp_path: Path, name: str) -> None:
    """Each kind keeps its extension (gc's ``is_hold`` reads it) and the name is cut at
    a character, never inside one; a name whose plain hold fits keeps it."""
    obj = tmp_path / name
    obj.write_bytes(b"x")
    assert hold([str(obj)], {}) == []
    [held] = tmp_path.glob(f"*{HOLD_SUFFIX}")
    assert str(held) == hold_url(str(obj))
    assert len(os.fsencode(held.name)) <= NAME_MAX and is_hold(held.name)
    if len(os.fsencode(name + HOLD_SUFFIX)) <= NAME_MAX:
        assert held.name == name + HOLD_SUFFIX
    else:
        kind = "." + name.split(".", 1)[1]
        assert held.name.endswith(kind + HOLD_SUFFIX) and "~" in held.name


def test_an_s3_key_with_no_room_for_a_hold_is_refused_before_anything_is_written() -> None:
    """An S3 object whose directory alone leaves no room under 1024 bytes even for a
    shortened hold name: the hold is refused, naming the key's length and the limit
    (S3 would refuse it, ``KeyTooLongError``, after the request)."""
    url = "s3://bucket/" + "d/" * 508 + "m.pte"  # a key of 1021 bytes
    with pytest.raises(StorageError) as info:
        hold([url], {})
    assert str(info.value) == (
        f"{url}{HOLD_SUFFIX}: the hold's key would be 1035 bytes, over S3's limit of "
        f"{S3_KEY_MAX} bytes per key, and its directory leaves no room for a shortened "
        "name: a shorter destination prefix makes it fit"
    )


@pytest.mark.s3
def test_on_s3_a_long_key_is_held_under_the_key_limit(s3_server: S3TestServer) -> None:
    """On moto and SeaweedFS: an object whose key is 1020 bytes is held under a key of
    at most 1024 bytes (``<object>.ptestore-hold`` was 1034: S3 refuses it), which gc's
    look (:func:`hold_url` of the listed URL) finds."""
    bucket, client = s3_server.new_bucket(), s3_server.client()
    parts = ["d" * 200] * 4  # directory names under 255 bytes: every server takes them
    key = "/".join([*parts, "m" * (1020 - 4 * 201 - 4)]) + ".pte"
    assert len(key) == 1020
    client.put_object(Bucket=bucket, Key=key, Body=b"x")
    url = f"s3://{bucket}/{key}"
    assert hold([url], s3_server.storage_options) == []
    listed = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    [held] = [k for k in listed if k != key]
    assert f"s3://{bucket}/{held}" == hold_url(url)
    assert len(held.encode()) <= S3_KEY_MAX and is_hold(held)
    assert held.startswith("/".join(parts) + "/" + "m" * 100)
    body = client.get_object(Bucket=bucket, Key=held)["Body"].read()
    assert json.loads(body)["object"] == url
