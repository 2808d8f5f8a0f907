"""Fleet job files: parsing, pairs, and errors that name the line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptestore.cli import main
from ptestore.fleet import JobError, load_job, parse_job

GOOD = """\
destination = "s3://models/{device}/{model}.pte"
backends = ["passthrough"]

[storage_options]
endpoint_url = "http://127.0.0.1:9000"

[[models]]
name = "mlp"
source = "s3://src/mlp.pte"
ptd = "s3://src/mlp.ptd"

[[models]]
source = "s3://src/conv.pte"

[devices.pixel9]
soc = "sm8650"
flags = ["-O3"]

[devices.galaxy]
"""


def test_parse_pairs_and_defaults() -> None:
    job = parse_job(GOOD, "job.toml")
    assert [m.name for m in job.models] == ["mlp", "conv"]
    assert job.models[0].ptd == "s3://src/mlp.ptd" and job.models[1].ptd is None
    assert [d.name for d in job.devices] == ["pixel9", "galaxy"]
    assert job.devices[0].options == {"soc": "sm8650", "flags": ["-O3"]}
    assert job.devices[1].options == {}
    assert job.storage_options == {"endpoint_url": "http://127.0.0.1:9000"}
    pairs = job.pairs()
    assert [(p.model.name, p.device.name, p.destination, p.ptd_destination) for p in pairs] == [
        ("mlp", "pixel9", "s3://models/pixel9/mlp.pte", "s3://models/pixel9/mlp.ptd"),
        ("mlp", "galaxy", "s3://models/galaxy/mlp.pte", "s3://models/galaxy/mlp.ptd"),
        ("conv", "pixel9", "s3://models/pixel9/conv.pte", None),
        ("conv", "galaxy", "s3://models/galaxy/conv.pte", None),
    ]
    assert job.options_for_loader("/local/x.pte") == {}
    assert job.options_for_writer("/local/x.pte") == {"auto_mkdir": True}
    assert job.options_for_writer("s3://b/k") == {
        "endpoint_url": "http://127.0.0.1:9000",
        "spool": False,
    }
    with_writer = parse_job(
        GOOD.replace("[storage_options]\n", "[storage_options]\npart_size = 1\n")
    )
    assert with_writer.options_for_loader("s3://b/k") == {"endpoint_url": "http://127.0.0.1:9000"}
    assert with_writer.options_for_writer("s3://b/k")["part_size"] == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("destination = 1\n", "job.toml:1: destination: required: a destination template"),
        (
            'destination = "x/{model}.pte"\n',
            "job.toml:1: destination: the template 'x/{model}.pte' must use {model} and "
            "{device} and no other field (found: model)",
        ),
        (
            'destination = "{device}/{model}-{date}.pte"\n',
            "no other field (found: date, device, model)",
        ),
        ('destination = "{device}/{model}.pte"\nbogus = 1\n', "job.toml:2: bogus: unknown key"),
        (
            'destination = "{device}/{model}.pte"\nbackends = "passthrough"\n',
            "job.toml:2: backends: must be a list of backend SPEC strings",
        ),
        (
            'destination = "{device}/{model}.pte"\n[devices.a]\n',
            "job.toml: models: at least one [[models]] table is required",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nname = "m"\n[devices.a]\n',
            "job.toml:2: models[0].source: required: the URL or path of the model's .pte",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            '[[models]]\nsource = "b.pte"\nsorce = "x"\n[devices.a]\n',
            "job.toml:6: models[1].sorce: unknown key (accepted: name, ptd, source)",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            '[[models]]\nsource = "b/a.pte"\n[devices.a]\n',
            "job.toml:4: models[1].name: duplicate model name 'a'",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            'name = "a b"\n[devices.a]\n',
            "job.toml:4: models[0].name: 'a b': a model name may use letters, digits",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n',
            "job.toml: devices: at least one [devices.NAME] table is required",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            "[devices]\nx = 1\n",
            "job.toml:5: devices.x: must be a table of options",
        ),
        (
            'destination = "{device}/{model}.bin"\n[[models]]\nsource = "a.pte"\n'
            'ptd = "a.ptd"\n[devices.a]\n',
            "job.toml:1: destination: must end with .pte when a model has a .ptd",
        ),
        (
            'destination = "out/{device}{model}.pte"\n[[models]]\nsource = "bc.pte"\n'
            '[[models]]\nsource = "c.pte"\n[devices.a]\n[devices.ab]\n',
            "job.toml:1: destination: pairs (bc, a) and (c, ab) share the destination out/abc.pte",
        ),
        ("destination = \n", "job.toml: invalid TOML: Invalid value (at line 1, column 15)"),
    ],
)
def test_errors_name_line_and_key(text: str, message: str) -> None:
    with pytest.raises(JobError) as info:
        parse_job(text, "job.toml")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            'destination = "o\\u0000/{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            "[devices.a]\n",
            "job.toml:1: destination",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a\\u0000.pte"\n'
            "[devices.a]\n",
            "job.toml:3: models[0].source",
        ),
        (
            'destination = "{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
            'ptd = "a\\u0000.ptd"\n[devices.a]\n',
            "job.toml:4: models[0].ptd",
        ),
    ],
)
def test_a_nul_in_a_path_is_a_job_error(
    text: str, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``\\u0000`` in a source, .ptd or destination: a JobError naming the key (exit
    2), not a ValueError from the OS and a traceback."""
    message = f"{where}: contains a NUL byte ('\\x00'): no path or URL can hold one"
    with pytest.raises(JobError) as info:
        parse_job(text, "job.toml")
    assert str(info.value) == message
    job = tmp_path / "job.toml"
    job.write_text(text)
    assert main(["fleet", "plan", str(job)]) == 2
    assert capsys.readouterr().err == f"ptestore fleet: error: {tmp_path}/{message}\n"


def test_load_job_errors(tmp_path: Path) -> None:
    with pytest.raises(JobError, match=f"{tmp_path / 'none.toml'}: job file not found"):
        load_job(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'destination = "\xff"\n')
    with pytest.raises(JobError, match=f"{bad}: not UTF-8 text at byte 15"):
        load_job(bad)
    with pytest.raises(JobError, match="cannot read the job file"):
        load_job(tmp_path)


def test_cli_bad_job_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text('destination = "{device}/{model}.pte"\nbackends = [1]\n')
    assert main(["fleet", "run", str(job), "--quiet"]) == 2
    assert f"{job}:2: backends: must be a list" in capsys.readouterr().err
    assert main(["fleet", "plan", str(job)]) == 2
    job.write_text(GOOD.replace('["passthrough"]', '["no_such_backend"]'))
    assert main(["fleet", "plan", str(job)]) == 2
    assert "backends: backend 'no_such_backend': unknown name" in capsys.readouterr().err


def test_deeply_nested_toml_is_a_job_error(tmp_path: Path) -> None:
    """The TOML parser recurses per nesting level: a deep array is a JobError (exit 2
    for every job command), never a RecursionError."""
    text = (
        'destination = "out/{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
        "[devices.a]\nx = " + "[" * 5000 + "]" * 5000 + "\n"
    )
    with pytest.raises(JobError) as info:
        parse_job(text, "deep.toml")
    assert str(info.value) == (
        "deep.toml: invalid TOML: arrays or tables nested deeper than the parser can read"
    )
    path = tmp_path / "deep.toml"
    path.write_text(text)
    for argv in (["fleet", "plan"], ["fleet", "retire"], ["verify", "--job"]):
        assert main([*argv, str(path)]) == 2, argv


@pytest.mark.parametrize(("flag", "value"), [("--models", ""), ("--devices", ",")])
def test_an_empty_filter_is_a_job_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    """``--models ""`` (an empty shell list) names nothing: it never runs every pair."""
    path = tmp_path / "job.toml"
    path.write_text(
        f'destination = "{tmp_path}/out/{{device}}/{{model}}.pte"\n'
        '[[models]]\nname = "m"\nsource = "a.pte"\n[devices.a]\n[devices.b]\n'
    )
    assert main(["fleet", "plan", str(path), flag, value]) == 2
    kind = flag[2:]
    have = "m" if kind == "models" else "a, b"
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"{path}: {flag} names no {kind[:-1]} (an empty list; {kind}: {have}): leave it out "
            f"to take every {kind[:-1]}"
        )
    )


@pytest.mark.parametrize(
    ("option", "key", "shown"),
    [
        ("scale = nan", "scale", "nan"),
        ("x = [1.0, -inf]", "x[1]", "-inf"),
        ("y = {z = inf}", "y.z", "inf"),
    ],
)
def test_non_finite_device_options_are_refused(option: str, key: str, shown: str) -> None:
    """A trailer and the index are JSON, which has no NaN or Infinity: a device option
    that is one (anywhere in it) is a JobError naming the device and the option."""
    text = (
        'destination = "o/{device}/{model}.pte"\n[[models]]\nsource = "a.pte"\n'
        f'[devices.p]\nsoc = "s"\n{option}\n'
    )
    with pytest.raises(JobError) as info:
        parse_job(text, "j.toml")
    assert str(info.value) == (
        f"j.toml:6: devices.p.{key.split('.')[0].split('[')[0]}: {shown}: device 'p' option "
        f"{key!r} must be a finite number (trailers and the index are JSON, which has no "
        "nan or inf)"
    )
