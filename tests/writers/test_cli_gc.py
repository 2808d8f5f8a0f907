"""``ptestore gc`` through add_gc_parser/run_gc (independent of the main CLI wiring)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.privileges import unprivileged

from ptestore.cli.gc import add_gc_parser
from ptestore.testing.s3server import S3TestServer
from ptestore.writers import LocalFileWriter, open_writer


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ptestore")
    add_gc_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def crashed_writer(path: Path) -> LocalFileWriter:
    w = LocalFileWriter(path)
    w.write(b"partial", 0)
    assert w._finalizer is not None
    w._finalizer.detach()
    w._st.close_fd()
    return w


def test_local_gc_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = crashed_writer(tmp_path / "m.pte")
    assert run(["gc", str(tmp_path), "--older-than", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove" in out
    assert w.staging_path in out
    assert "would remove 1 of 1 leftover(s) older than 0s; 0 failed" in out
    assert run(["gc", str(tmp_path), "--older-than", "0"]) == 0
    assert "removed 1 of 1 leftover(s) older than 0s; 0 failed" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_local_gc_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crashed_writer(tmp_path / "m.pte")
    assert run(["gc", str(tmp_path), "--json"]) == 0  # default: one day old only
    report = json.loads(capsys.readouterr().out)
    assert report["removed"] == 0
    assert report["entries"][0]["action"] == "skipped: younger than 86400s"
    assert run(["gc", f"file://{tmp_path}", "--json", "--older-than", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["removed"] == 1
    assert report["entries"][0]["kind"] == "staging-file"
    assert report["entries"][0]["size"] == 7


def test_local_gc_of_dot_dot_after_a_link_scans_where_the_kernel_resolves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gc lnk/..`` (``lnk -> real/sub``) is ``real``, not ``tmp_path`` (text)."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to("real/sub", target_is_directory=True)
    top = crashed_writer(tmp_path / "top.pte")
    real = crashed_writer(tmp_path / "real" / "m.pte")
    assert run(["gc", f"{tmp_path}/lnk/..", "--older-than", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 1 of 1 leftover(s) older than 0s; 0 failed" in out
    assert Path(real.staging_path).name in out and Path(top.staging_path).name not in out


def test_gc_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["gc", "memory://x"]) == 2
    assert "ptestore gc: error: memory://x: gc supports local paths and s3:// prefixes" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        run(["gc", str(tmp_path), "--older-than", "-5"])
    assert "expected a duration >= 0, got '-5'" in capsys.readouterr().err


@pytest.mark.s3
def test_s3_gc(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    w = open_writer(f"s3://{s3_bucket}/p/m.pte", **s3_server.storage_options)
    w.write(bytes(9 << 20), 0)  # one complete 8 MiB part uploads
    w.wait_uploads()  # type: ignore[attr-defined]
    w._finalizer.detach()  # type: ignore[attr-defined]
    opts = [f"-o{k}={json.dumps(v)}" for k, v in s3_server.storage_options.items()]
    assert run(["gc", f"s3://{s3_bucket}/p/", "--older-than", "0", "--json", *opts]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [e["action"] for e in report["entries"]] == ["removed"]
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert run(["gc", f"s3://{s3_bucket}/p/", "-o", "bogus=1"]) == 2
    assert "options ['bogus'] do not apply to gc of s3://" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "1e999", "soon"])
def test_gc_older_than_must_be_a_finite_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        run(["gc", str(tmp_path), "--older-than", value, "--json"])
    assert info.value.code == 2
    err = capsys.readouterr()
    assert err.out == ""  # never a report with NaN or Infinity in it
    if value == "1e999":  # a number, but not a finite one
        assert f"expected a finite duration, got '{value}'" in err.err
    else:  # "nan" and "inf" are not durations (a number with an optional unit)
        assert "expected a duration such as 90s, 30m, 12h or 7d (a number with an optional " in (
            err.err
        )
        assert f"got '{value}'" in err.err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "1", True])
def test_collect_functions_refuse_bad_older_than(tmp_path: Path, value: object) -> None:
    from ptestore.errors import ConfigurationError
    from ptestore.gc import collect_local, collect_s3, collect_stale

    msg = rf"older_than must be a finite number of seconds >= 0, got {value!r}"
    for fn, target in [
        (collect_stale, str(tmp_path)),
        (collect_local, str(tmp_path)),
        (collect_s3, "s3://bucket/p/"),
    ]:
        with pytest.raises(ConfigurationError, match=msg.replace("(", r"\(")):
            fn(target, older_than=value)  # type: ignore[operator]


@pytest.mark.s3
@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("client_kwargs=[1]", r"option client_kwargs = \[1\]: must be a dict"),
        ("retry_attempts=x", r"retry_attempts = 'x': must be an int"),
        ("retry_initial=NaN", r"retry_initial = nan: must be a finite number"),
        ("retry_max=Infinity", r"retry_max = inf: must be a finite number"),
    ],
)
def test_gc_storage_option_values_are_configuration_errors(
    s3_server: S3TestServer,
    s3_bucket: str,
    capsys: pytest.CaptureFixture[str],
    option: str,
    message: str,
) -> None:
    opts = [f"-o{k}={json.dumps(v)}" for k, v in s3_server.storage_options.items()]
    assert run(["gc", f"s3://{s3_bucket}/p/", *opts, "-o", option]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"ptestore gc: error: s3://{s3_bucket}/p/: .*{message}", err), err


@pytest.mark.s3
def test_gc_never_reports_other_tools_uploads_whatever_their_age(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ownership is checked before age: a young upload of another tool is not even
    reported as 'younger than'; ptestore's own young upload is. (moto dates every
    upload 2010-11-10, so "young" here means younger than a huge --older-than.)"""
    other = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="p/other.bin")["UploadId"]
    s3_client.upload_part(
        Bucket=s3_bucket, Key="p/other.bin", UploadId=other, PartNumber=1, Body=b"x" * 100
    )
    w = open_writer(f"s3://{s3_bucket}/p/m.pte", **s3_server.storage_options)
    w.write(bytes(9 << 20), 0)
    w.wait_uploads()  # type: ignore[attr-defined]
    opts = [f"-o{k}={json.dumps(v)}" for k, v in s3_server.storage_options.items()]
    assert run(["gc", f"s3://{s3_bucket}/p/", "--json", "--older-than", "1e12", *opts]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(e["location"].split("?")[0], e["action"]) for e in report["entries"]] == [
        (f"s3://{s3_bucket}/p/m.pte", "skipped: younger than 1e+12s")
    ]
    assert report["entries"][0]["size"] > 8 << 20  # the marker and one 8 MiB part
    w.discard()
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["UploadId"] for u in uploads] == [other]


def test_an_unreadable_directory_is_a_failure_not_silence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory gc cannot list may hold staging files: reported failed, exit 1."""
    locked = tmp_path / "locked"
    locked.mkdir()
    crashed_writer(locked / "m.pte")
    locked.chmod(0o000)
    out = tmp_path / "out.json"
    try:

        def gc() -> int:
            with open(out, "w") as f, contextlib.redirect_stdout(f):
                return run(["gc", str(tmp_path), "--older-than", "0", "--json"])

        assert unprivileged(gc) == 1
    finally:
        locked.chmod(0o755)
    report = json.loads(out.read_text())
    assert report["failed"] == 1
    (entry,) = report["entries"]
    assert entry["location"] == str(locked)
    assert entry["kind"] == "directory"
    assert entry["action"] == "failed: cannot list: Permission denied"


@pytest.mark.s3
@pytest.mark.parametrize(("kind", "action"), [("lost", "removed"), ("503", "removed")])
def test_an_abort_whose_answer_was_lost_is_counted_removed(
    s3_server: S3TestServer, s3_bucket: str, s3_client: Any, kind: str, action: str
) -> None:
    """The first abort of a stale upload reaches the service and its answer is lost (a
    read timeout): the retry's ``NoSuchUpload`` is gc's own abort, ``removed`` (was
    ``skipped: already gone``). A 503 turned the first away: the retry aborts it."""
    import aiobotocore.session

    from ptestore.gc import collect_s3
    from writers.s3_faults import Fault

    w = open_writer(f"s3://{s3_bucket}/p/m.pte", **s3_server.storage_options)
    w.write(bytes(9 << 20), 0)  # one complete 8 MiB part uploads
    w.wait_uploads()  # type: ignore[attr-defined]
    w._finalizer.detach()  # type: ignore[attr-defined]
    fault = Fault("AbortMultipartUpload", kind, times=1)
    session = aiobotocore.session.AioSession()
    session.register("before-send.s3.AbortMultipartUpload", fault)
    opts = {**s3_server.storage_options, "retry_initial": 0.0, "session": session}
    [entry] = collect_s3(f"s3://{s3_bucket}/p/", older_than=0, **opts)
    assert entry.action == action
    assert (fault.calls, fault.injected) == (2, 1)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
def test_an_upload_initiated_without_a_zone_is_read_as_utc(
    s3_server: S3TestServer,
    s3_bucket: str,
    s3_client: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``ListMultipartUploads`` answer whose ``Initiated`` carries no zone
    (``2026-12-06T04:00:00.000``: botocore makes it a naive datetime) is read as UTC, as
    a ``Date`` without one is, whatever the local zone: one two days old is aborted, one
    an hour old is kept (was a ``TypeError`` traceback: offset-naive minus offset-aware).
    One initiated 10 years ahead (a server's clock ahead then) has no age gc can measure:
    kept, and the action names the time (S3 has no lock to ask, as a staging file's)."""
    import time
    from datetime import datetime, timedelta, timezone

    from support.faulty_proxy import faulty_proxy

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()

    def stale(key: str) -> None:
        w = open_writer(f"s3://{s3_bucket}/{key}", **s3_server.storage_options)
        w.write(bytes(9 << 20), 0)  # one complete 8 MiB part uploads
        w.wait_uploads()  # type: ignore[attr-defined]
        w._finalizer.detach()  # type: ignore[attr-defined]

    stale("p/old.pte")
    stale("p/new.pte")
    stale("p/ahead.pte")
    now = datetime.now(timezone.utc)
    initiated = {
        "p/old.pte": now - timedelta(days=2),
        "p/new.pte": now - timedelta(hours=1),
        "p/ahead.pte": now + timedelta(days=3653),
    }

    def answer(
        method: str, path: str, request: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes]:
        if method != "GET" or "uploads" not in path.partition("?")[2]:
            return headers, body

        def zoneless(upload: re.Match[str]) -> str:
            key = re.search(r"<Key>([^<]*)</Key>", upload[0])
            assert key is not None
            naive = initiated[key[1]].strftime("%Y-%m-%dT%H:%M:%S.000")
            return re.sub(
                r"<Initiated>[^<]*</Initiated>", f"<Initiated>{naive}</Initiated>", upload[0]
            )

        text = re.sub(r"<Upload>.*?</Upload>", zoneless, body.decode(), flags=re.S)
        assert text.count("<Initiated>") == 3 and "Z</Initiated>" not in text, text
        return headers, text.encode()

    try:
        with faulty_proxy(s3_server.endpoint_url, every=0) as (endpoint, proxy):
            proxy.answer = answer
            options = {**s3_server.storage_options, "endpoint_url": endpoint}
            opts = [f"-o{k}={json.dumps(v)}" for k, v in options.items()]
            assert run(["gc", f"s3://{s3_bucket}/p/", "--json", *opts]) == 0
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    report = json.loads(capsys.readouterr().out)
    got = {e["location"].split("?")[0]: (e["age"], e["action"]) for e in report["entries"]}
    old, new = got[f"s3://{s3_bucket}/p/old.pte"], got[f"s3://{s3_bucket}/p/new.pte"]
    assert old[1] == "removed" and abs(old[0] - 2 * 86400) < 600
    assert new[1] == "skipped: younger than 86400s" and abs(new[0] - 3600) < 600
    age, action = got[f"s3://{s3_bucket}/p/ahead.pte"]
    shown = initiated["p/ahead.pte"].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert age == 0.0 and action.startswith(
        f"skipped: its initiation time {shown} is not plausible (more than 86400s after now, "
    ), action
    assert action.endswith("Z): its age is unknown"), action
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert sorted(u["Key"] for u in uploads) == ["p/ahead.pte", "p/new.pte"]


@pytest.mark.parametrize("ahead", [True, False], ids=["3-years-ahead", "1970"])
def test_a_staging_file_of_implausible_time_is_kept_unless_any_age_is_asked_for(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ahead: bool,
) -> None:
    """A staging file whose mtime is 3 years ahead (stamped by a clock ahead) or in
    1970 has no age gc can measure: kept and reported with its time (was, 3 years ahead:
    ``skipped: younger than 86400s``, silently; and for a while its lock decided, which
    removed a live ``put_bytes`` temporary, never locked by earlier versions, and on NFS a
    lock another client holds may not be seen). ``--older-than 0`` asks for any age:
    then the lock decides, a dead writer's removed, a live one's kept."""
    import os
    import time

    dead = crashed_writer(tmp_path / "dead.pte")
    live = LocalFileWriter(tmp_path / "live.pte")
    live.write(b"partial", 0)
    when = time.time() + 3 * 365 * 86400 if ahead else 5.0
    for w in (dead, live):
        os.utime(w.staging_path, (when, when))
    try:
        assert run(["gc", str(tmp_path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        got = {e["location"]: (e["age"], e["action"]) for e in report["entries"]}
        shown = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(when)))
        limit = "more than 86400s after now, 20" if ahead else "before 2000-01-01T00:00:00Z)"
        for where in (dead.staging_path, live.staging_path):
            age, action = got[where]
            assert age == 0.0 and action.startswith(
                f"skipped: its modification time {shown} is not plausible ({limit}"
            ), action
            assert action.endswith(": its age is unknown (--older-than 0: its lock decides)")
        assert os.path.exists(dead.staging_path) and os.path.exists(live.staging_path)
        assert run(["gc", str(tmp_path), "--older-than", "0", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        got = {e["location"]: (e["age"], e["action"]) for e in report["entries"]}
        assert got == {
            dead.staging_path: (0.0, "removed"),
            live.staging_path: (0.0, "skipped: in use by a live writer"),
        }
        assert not os.path.exists(dead.staging_path) and os.path.exists(live.staging_path)
    finally:
        live.discard()


def test_put_bytes_holds_its_temporary_files_lock_until_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc run while ``put_bytes`` writes its temporary file (any age asked for): the file
    is in use, kept, and the publish goes through (it was removed under the writer:
    ``cannot publish: No such file or directory``)."""
    import os

    from ptestore import gc
    from ptestore.storage import atomic

    seen: list[list[tuple[str, str]]] = []
    real_write = os.write

    def write_then_gc(fd: int, data: object) -> int:
        if not seen:
            found = gc.collect_local(tmp_path, older_than=0)
            seen.append([(os.path.basename(e.location), e.action) for e in found])
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic.os, "write", write_then_gc)
    atomic.put_bytes(str(tmp_path / "manifest.json"), b"{}")
    [[(name, action)]] = seen
    assert name.startswith(".manifest.json.ptestore-") and action == (
        "skipped: in use by a live writer"
    )
    assert (tmp_path / "manifest.json").read_bytes() == b"{}"
