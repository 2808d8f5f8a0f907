"""Fleet destinations are checked as the store will address them: names are never path
syntax, templates take bare fields only, and no destination collides with another,
is one of the job's sources or leaves the template's root (local, memory and S3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptestore.cli import main
from ptestore.fleet import JobError, parse_job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

#: A template root per store (local paths are made absolute by the test).
ROOTS = {"local": "", "memory": "memory://fleet/", "s3": "s3://bucket/"}


def job(dest: str, models: str, devices: str) -> str:
    return f'destination = "{dest}"\n{models}{devices}'


def model(source: str, name: str | None = None) -> str:
    return "[[models]]\n" + (f'name = "{name}"\n' if name else "") + f'source = "{source}"\n'


def device(name: str) -> str:
    return f'[devices."{name}"]\n'


def root(store: str, tmp_path: Path) -> str:
    return f"{tmp_path}/" if store == "local" else ROOTS[store]


@pytest.mark.parametrize("bad", [".", ".."])
def test_path_syntax_names_are_refused(bad: str) -> None:
    with pytest.raises(JobError) as info:
        parse_job(job("out/{device}/{model}.pte", model("a.pte", bad), device("x")), "j.toml")
    assert str(info.value) == (
        f"j.toml:3: models[0].name: {bad!r}: a model name may use letters, digits, '.', '_' "
        "and '-' and may not be '.' or '..'"
    )
    with pytest.raises(JobError) as info:
        parse_job(job("out/{device}/{model}.pte", model("a.pte"), device(bad)), "j.toml")
    assert str(info.value) == (
        f"j.toml:4: devices.{bad}: {bad!r}: a device name may use letters, digits, '.', '_' "
        "and '-' and may not be '.' or '..'"
    )
    # A default name (the source's stem) that is path syntax is refused too.
    with pytest.raises(JobError, match=r"models\[0\].name: '\.\.': a model name"):
        parse_job(job("out/{device}/{model}.pte", model("s3://b/.."), device("x")), "j.toml")


@pytest.mark.parametrize(
    ("template", "shown"),
    [
        ("out/{device}/{model:d}.pte", "{model:d}"),
        ("out/{device}/{model:{device}}.pte", "{model:{device}}"),
        ("out/{device}/{model!r}.pte", "{model!r}"),
        ("out/{device!s:>4}/{model}.pte", "{device!s:>4}"),
    ],
)
def test_template_fields_must_be_bare(template: str, shown: str) -> None:
    with pytest.raises(JobError) as info:
        parse_job(job(template, model("a.pte"), device("x")), "j.toml")
    assert str(info.value) == (
        f"j.toml:1: destination: the template {template!r} uses {shown}: only bare fields "
        "{model} and {device} are accepted (no format spec or conversion)"
    )


@pytest.mark.parametrize("template", ["out/{device}/{model", "out/{device}}/{model}.pte"])
def test_malformed_template_is_a_job_error(template: str) -> None:
    with pytest.raises(JobError, match=r"j\.toml:1: destination: the template .* is not a valid"):
        parse_job(job(template, model("a.pte"), device("x")), "j.toml")


@pytest.mark.parametrize("store", list(ROOTS))
def test_collisions_are_checked_on_normalized_destinations(store: str, tmp_path: Path) -> None:
    base = root(store, tmp_path)
    text = job(base + "o/{device}/../{model}.pte", model(base + "s/a.pte"), device("x"))
    parse_job(text)  # one device: no collision
    text += device("y")
    with pytest.raises(JobError) as info:
        parse_job(text, "j.toml")
    assert str(info.value) == (
        f"j.toml:1: destination: pairs (a, x) and (a, y) share the destination "
        f"{base}o/x/../a.pte and {base}o/y/../a.pte"
    )


@pytest.mark.parametrize("store", list(ROOTS))
def test_a_destination_is_never_a_source(store: str, tmp_path: Path) -> None:
    base = root(store, tmp_path)
    src = base + "o/a.pte"
    with pytest.raises(JobError) as info:
        parse_job(job(base + "o/{device}/../{model}.pte", model(src), device("x")), "j.toml")
    assert str(info.value) == (
        f"j.toml:1: destination: pair (a, x)'s destination {base}o/x/../a.pte is the source "
        f"{src}: a destination must never be one of the job's sources"
    )


@pytest.mark.parametrize("store", list(ROOTS))
def test_a_destination_never_leaves_the_template_root(store: str, tmp_path: Path) -> None:
    base = root(store, tmp_path)
    with pytest.raises(JobError) as info:
        parse_job(job(base + "o/{device}/../../{model}.pte", model("a.pte"), device("x")), "j")
    assert str(info.value) == (
        f"j:1: destination: pair (a, x)'s destination {base}o/x/../../a.pte is outside the "
        f"template's root {base}o/"
    )


def test_s3_spellings_the_store_folds_are_one_destination() -> None:
    # SeaweedFS stores 'a\\b' as 'a/b' and 'a//b' as 'a/b': one object.
    text = job("s3://b/o/{device}/{model}.pte", model("s3://b/o/x//a.pte"), device("x"))
    with pytest.raises(JobError, match=r"is the source s3://b/o/x//a\.pte"):
        parse_job(text)
    text = job("s3://b/o/{device}/{model}.pte", model("s3://b/o/x\\\\a.pte", "a"), device("x"))
    with pytest.raises(JobError, match=r"is the source s3://b/o/x\\a\.pte"):
        parse_job(text)


def test_fleet_run_refuses_a_job_that_would_overwrite_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported attack: a destination under the sources' directory that resolves to
    the source itself. Exit 2, nothing written, the source intact."""
    src = tmp_path / "src" / "mlp_xnnpack.pte"
    src.parent.mkdir()
    original = (FIXTURES / "mlp_xnnpack.pte").read_bytes()
    src.write_bytes(original)
    path = tmp_path / "job.toml"
    path.write_text(
        job(f"{tmp_path}/src/{{device}}/../{{model}}.pte", model(str(src)), device("x"))
    )
    before = sorted(os.listdir(tmp_path / "src"))
    assert main(["fleet", "run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"is the source {src}: a destination must never be one of the job's sources" in err
    assert src.read_bytes() == original
    assert sorted(os.listdir(tmp_path / "src")) == before


@pytest.mark.parametrize("store", list(ROOTS))
@pytest.mark.parametrize(
    ("template", "name", "dst", "why"),
    [
        (
            "{model}.{device}",
            "ptestore-index",
            "ptestore-index.json",
            "has a name beginning ptestore-index ('ptestore-index.json'), which the job's "
            "index takes ({base}ptestore-index.json and its shards)",
        ),
        (
            "{model}/{device}.pte",
            "ptestore-index.v3-1a2b3c4d",
            "ptestore-index.v3-1a2b3c4d/json.pte",
            "has a name beginning ptestore-index ('ptestore-index.v3-1a2b3c4d'), which the "
            "job's index takes ({base}ptestore-index.json and its shards)",
        ),
        (
            "{device}/{model}.pte",
            ".ptestore-preflight-0",
            "json/.ptestore-preflight-0.pte",
            "has a name beginning .ptestore-preflight- ('.ptestore-preflight-0.pte'), which "
            "the preflight's marker takes",
        ),
        (
            "{device}/{model}",
            "m.xpwc.json",
            "json/m.xpwc.json",
            "ends with .xpwc.json, which names XNNPACK's packed-weight files and their "
            "records beside the artifacts",
        ),
        (
            "{device}/{model}",
            "m.xnnpack-0123.xpwc",
            "json/m.xnnpack-0123.xpwc",
            "ends with .xpwc, which names XNNPACK's packed-weight files and their records "
            "beside the artifacts",
        ),
    ],
)
def test_a_destination_never_takes_the_jobs_own_names(
    store: str, tmp_path: Path, template: str, name: str, dst: str, why: str
) -> None:
    """The index, its shards, the preflight's marker and XNNPACK's records are the job's
    own objects: an artifact published over one of them would destroy it."""
    base = root(store, tmp_path)
    with pytest.raises(JobError) as info:
        parse_job(job(base + template, model(base + "src/a.pte", name), device("json")), "j")
    assert str(info.value) == (
        f"j:1: destination: pair ({name}, json)'s destination {base}{dst} " + why.format(base=base)
    )


def test_the_reserved_names_are_the_ones_the_job_writes() -> None:
    from ptestore.fleet import job_check
    from ptestore.fleet.index import INDEX_NAME
    from ptestore.fleet.packed import file_url, record_url
    from ptestore.fleet.preflight import MARKER_PREFIX

    assert INDEX_NAME.startswith(job_check.INDEX_PREFIX)
    assert MARKER_PREFIX == job_check.PREFLIGHT_PREFIX
    assert record_url("s/m.pte").endswith(job_check.XNNPACK_SUFFIXES)
    assert file_url("s/m.pte", "xnnpack-" + "0" * 32).endswith(job_check.XNNPACK_SUFFIXES)


def test_fleet_run_never_writes_over_its_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported run: a model named ptestore-index on a device named json, under a
    template {model}.{device}, was published over the index: exit 2 now, index intact."""
    src = tmp_path / "src.pte"
    src.write_bytes((FIXTURES / "mlp_xnnpack.pte").read_bytes())
    path = tmp_path / "job.toml"
    path.write_text(
        job(f"{tmp_path}/out/{{model}}.{{device}}", model(str(src), "m"), device("json"))
    )
    assert main(["fleet", "run", str(path), "--quiet", "--workers", "1"]) == 0
    index = (tmp_path / "out" / "ptestore-index.json").read_bytes()
    path.write_text(
        job(
            f"{tmp_path}/out/{{model}}.{{device}}",
            model(str(src), "m") + model(str(src), "ptestore-index"),
            device("json"),
        )
    )
    capsys.readouterr()
    assert main(["fleet", "run", str(path), "--quiet", "--workers", "1"]) == 2
    assert "which the job's index takes" in capsys.readouterr().err
    assert (tmp_path / "out" / "ptestore-index.json").read_bytes() == index


def test_a_job_loads_in_time_linear_in_its_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each destination is looked up, never compared with every source: the identity
    calls grow with the pairs (counted, not timed)."""
    from ptestore.coordinator import targets
    from ptestore.fleet import job_check

    calls = [0]
    real = targets.target_identity

    def counted(url: str) -> tuple[str, str]:
        calls[0] += 1
        return real(url)

    monkeypatch.setattr(job_check, "target_identity", counted)
    monkeypatch.setattr(targets, "same_target", lambda a, b: pytest.fail("pairwise compare"))

    def text(m: int, d: int) -> str:
        models = "".join(model(f"s3://src/m{i}.pte", f"m{i}") for i in range(m))
        return job(
            "s3://b/out/{device}/{model}.pte", models, "".join(device(f"d{j}") for j in range(d))
        )

    parse_job(text(40, 10))
    assert calls[0] <= 40 + 40 * 10 + 2


@pytest.mark.parametrize("store", ["local", "s3"])
def test_names_too_long_for_their_store_are_refused(tmp_path: Path, store: str) -> None:
    """A name a pair would write that its store cannot take: its destination, or, when
    its device asks for XNNPACK's packed-weight file, that file's name beside it
    (``<stem>.xnnpack-<32 hex>.xpwc``, 46 bytes more than the stem): refused when the
    job is read, not by a run that made the artifact first (local: 255 bytes a name,
    S3: 1,024 a key)."""
    base = root(store, tmp_path)
    stem = "m" * (210 if store == "local" else 979 - len("d/"))
    cpu = 'xnnpack_cpu = "aarch64/page=4096:asimd"\n'
    text = job(f"{base}{{device}}/{{model}}.pte", model("a.pte", stem), device("d") + cpu)
    dst = f"{base}d/{stem}.pte"
    name, limit, unit = (
        (f"{stem}.xnnpack-<32 hex>.xpwc", 255, "a file name")
        if store == "local"
        else (f"{stem}.xnnpack-<32 hex>.xpwc", 1024, "an S3 key")
    )
    size = len(stem) + 46 + (0 if store == "local" else len("d/"))
    with pytest.raises(JobError) as info:
        parse_job(text, "j.toml")
    assert str(info.value) == (
        f"j.toml:1: destination: pair ({stem}, d)'s XNNPACK packed-weight file "
        f"(xnnpack_cpu) beside {dst}, {name}, would take {size} bytes, over the {limit} "
        f"{unit} may take: a shorter model or device name, or template, makes it fit"
    )
    # Without the packed-weight file, the destination itself fits.
    parse_job(job(f"{base}{{device}}/{{model}}.pte", model("a.pte", stem), device("d")), "j.toml")
    # A destination too long for its store.
    longer = "m" * (252 if store == "local" else 1020)
    text = job(f"{base}{{device}}/{{model}}.pte", model("a.pte", longer), device("d"))
    with pytest.raises(JobError) as info:
        parse_job(text, "j.toml")
    size = len(longer) + 4 + (0 if store == "local" else len("d/"))
    assert str(info.value) == (
        f"j.toml:1: destination: pair ({longer}, d)'s destination {base}d/{longer}.pte "
        f"would take {size} bytes, over the {limit} {unit} may take: a shorter model or "
        "device name, or template, makes it fit"
    )
