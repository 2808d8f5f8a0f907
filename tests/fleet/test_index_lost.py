"""A publish into a model whose leaf is lost refuses that model's entries rather than
create the leaf again with them alone (a create by ``If-None-Match`` succeeds where the
leaf was): the lost devices would then read "no entry" for good, and no reader,
``check-index`` or ``gc`` could tell. What its reads show lost is what one device's
look-up refuses (a half its split node names, the top node under a catalog, the node of
a device the catalog lists, below a marker naming no halves a half beside a leaf); the
legitimate creates (a model's first leaf, a half its split left empty, migrated or not)
still happen, and the other models of the publish are published. Locally, in a real
run (its ``index_error``, exit 1), and on moto and SeaweedFS; each message pinned."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import get_fixture

from ptestore.cli import main
from ptestore.errors import FormatError
from ptestore.fleet.index import create_index, find_entry, load_index, open_index, publish_entries
from ptestore.fleet.index_check import check_index
from ptestore.fleet.index_place import device_bits
from ptestore.fleet.index_trie import ModelTrie, Node
from ptestore.testing.fleet_index import synthetic_entry
from ptestore.testing.s3server import S3TestServer
from ptestore.viz.html import esc

#: Devices whose hashes all begin with 0 (leaves of 1 KiB: one entry each): the top node
#: splits, all of them into t0 (t1 never exists: a half left empty), and so on down.
DEVICES = [n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("0")][:4]
#: A device whose hash begins with 1 (its node t1, a half the top's split left empty).
ELSEWHERE = next(n for n in (f"dev-{i}" for i in range(200)) if device_bits(n).startswith("1"))
MUST = "must be every node its catalogs and split nodes name"


def _refused(url: str, shards: str, problem: str, model: str = "m") -> str:
    """What a publish into ``model`` says of the lost leaf ``problem`` names."""
    return (
        f"{url}: index shards = '{shards}': {MUST} ({problem}; the entries of model "
        f"{model!r} are not published: created with them alone, the missing leaf would hide "
        "its loss (read as holding only them, its other devices as having no entry, by every "
        f"reader, check-index and gc). Restore it (`ptestore fleet check-index {url}` says "
        "what is missing))"
    )


def _index(url: str, options: dict[str, Any] | None = None, listed: int = 8) -> tuple[str, str]:
    """DEVICES of model m in leaves of 1 KiB (one class, ``listed`` names of it listed):
    the shard directory's name and m's directory."""
    create_index(url, leaf_bytes=1024, listed=listed, storage_options=options)
    publish_entries(url, [synthetic_entry("m", d, socs=1) for d in DEVICES], options or {})
    _, sharded, _ = open_index(url, options)
    assert sharded is not None
    return sharded.layout["shards"], sharded.model_dir("m")


def _leaf_of(device: str) -> str:
    """The prefix of ``device``'s leaf in :func:`_index`."""
    bits = device_bits(device)
    depth = max(
        next(k for k in range(256) if device_bits(o)[k] != bits[k]) for o in DEVICES if o != device
    )
    return bits[: depth + 1]


def _sibling(prefix: str) -> str:
    return prefix[:-1] + "10"[int(prefix[-1])]


def _hashed_below(prefix: str) -> str:
    """A device name, never published, whose hash begins with ``prefix``."""
    return next(
        n for n in (f"new-{i}" for i in range(100_000)) if device_bits(n).startswith(prefix)
    )


def _strip_halves(model: str) -> None:
    """The split markers of ``model`` as an earlier ptestore wrote them: no halves."""
    for node in Path(model).glob("t*.json"):
        value = json.loads(node.read_text())
        if value["state"] == "split":
            node.write_text(json.dumps({k: v for k, v in value.items() if k != "halves"}))


def _leaves() -> dict[str, str]:
    return {_leaf_of(d): d for d in DEVICES}


def _named_half(model: str) -> tuple[str, str]:
    """A leaf beside a split node (not a sibling leaf's), its device not the listed one
    (``listed=1``), and what its split node, naming it, says of it lost."""
    leaf = next(
        p
        for p, d in sorted(_leaves().items())
        if d != min(DEVICES) and _sibling(p) not in _leaves()
    )
    return leaf, (
        f"{model}/t{leaf[:-1]}.json: index shard halves = ['0', '1']: must be halves that "
        "exist (a split creates the halves it names before it commits, and a node is never "
        f"removed) ({model}/t{leaf}.json is not found: a leaf is missing)"
    )


def _top(model: str) -> tuple[str, str]:
    return "", (
        f"{model}/t.json: index shard = 'not found': must be there while its model's catalog "
        f"is ({model}/catalog.json is there: a leaf is missing (a writer writes the leaves "
        "before the catalog, and never removes one))"
    )


def _listed(model: str) -> tuple[str, str]:
    """Below markers naming no halves: the shallowest leaf (beside a split node), of a
    device the catalog lists."""
    _strip_halves(model)
    leaf = min(_leaves(), key=len)
    catalog = json.loads(Path(f"{model}/catalog.json").read_text())
    [(i, j)] = [
        (i, j)
        for i, c in enumerate(catalog["classes"])
        for j, d in enumerate(c["devices"])
        if d == _leaves()[leaf]
    ]
    return leaf, (
        f"{model}/catalog.json: index catalog classes[{i}].devices[{j}] = '{_leaves()[leaf]}': "
        "must be a device whose entry is in one of the model's leaves (its leaf is "
        f"{model}/t{leaf}.json: not found: a leaf is missing (a writer updates the leaves "
        "before the catalog, and never removes an entry))"
    )


def _beside_a_leaf(model: str) -> tuple[str, str]:
    """Below markers naming no halves: a leaf whose sibling is a leaf."""
    _strip_halves(model)
    leaf = next(p for p in sorted(_leaves()) if _sibling(p) in _leaves())
    return leaf, (
        f"{model}/t{leaf[:-1]}.json: index shard state = 'split': must be a node whose halves "
        "both exist, unless one got none of the entries it split (the other got them all, "
        f"and was split in turn) ({model}/t{leaf}.json is not found and "
        f"{model}/t{_sibling(leaf)}.json is a leaf: a leaf is missing)"
    )


@pytest.mark.parametrize(
    ("lose", "listed"),
    [(_named_half, 1), (_top, 8), (_listed, 8), (_beside_a_leaf, 8)],
    ids=["named-half", "top", "listed-device", "beside-a-leaf"],
)
def test_a_publish_refuses_to_create_a_lost_leaf_again(
    tmp_path: Path, lose: Callable[[str], tuple[str, str]], listed: int
) -> None:
    """A leaf lost, then a publish of a new device whose hash leads there (and of
    another model): the model's entries refused, the leaf not created, the index still
    refused by its readers and reported by check-index; the other model published.
    Before, the leaf was created holding the new entry alone, and the lost devices read
    "no entry" (their files then gc's to remove)."""
    url = str(tmp_path / "ptestore-index.json")
    shards, model = _index(url, listed=listed)
    leaf, problem = lose(model)
    Path(f"{model}/t{leaf}.json").unlink()
    new = _hashed_below(leaf)
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", new), synthetic_entry("n", new)], {})
    assert str(caught.value) == _refused(url, shards, problem)
    assert not Path(f"{model}/t{leaf}.json").exists()
    assert find_entry(url, "n", new) is not None  # the other model's entries published
    with pytest.raises(FormatError):
        load_index(url)
    [found] = check_index(url).problems["m"]  # (what it reads first may tell another way)
    assert found.startswith("missing leaf: ")


@pytest.mark.parametrize("halves", [True, False], ids=["halves", "earlier-marker"])
def test_a_publish_still_creates_a_half_its_split_left_empty(tmp_path: Path, halves: bool) -> None:
    """t1, the half the top's split left empty (all DEVICES went to t0, which split in
    turn), gets its first entry: created (its split node does not name it; below a
    marker an earlier ptestore wrote, its sibling is split), and read whole."""
    url = str(tmp_path / "ptestore-index.json")
    _, model = _index(url)
    if not halves:
        _strip_halves(model)
    top = json.loads(Path(f"{model}/t.json").read_text())
    assert top["state"] == "split" and top.get("halves", ["0"]) == ["0"]
    publish_entries(url, [synthetic_entry("m", ELSEWHERE, socs=1)], {})
    assert Path(f"{model}/t1.json").exists()
    assert [e["device"] for e in load_index(url)["entries"]] == sorted([*DEVICES, ELSEWHERE])
    assert check_index(url).problems == {}


EXT = get_fixture("mlp_xnnpack_ext")


def _job(path: Path, dest: Path, devices: list[str], models: tuple[str, ...] = ("mlp",)) -> Path:
    path.write_text(
        f'destination = "{dest}/{{device}}/{{model}}.pte"\n'
        'backends = ["support.fleet_backend:Scaler=1.0"]\n'
        + "".join(
            f'[[models]]\nname = "{m}"\nsource = "{EXT.pte_path}"\nptd = "{EXT.ptd_path}"\n'
            for m in models
        )
        + "".join(f'[devices.{d}]\nsoc = "s{i}"\n' for i, d in enumerate(devices))
    )
    return path


def test_a_run_into_a_model_whose_top_node_is_lost_reports_an_index_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run of devices a and b, the model's top node (its only leaf) then lost; a
    job of device c into the same index: its pair done, its entry refused (the run's
    index_error, exit 1), the top node not created (before: created holding c alone, a
    and b "no entry")."""
    out = tmp_path / "out"
    ab = _job(tmp_path / "ab.toml", out, ["a", "b"])
    assert main(["fleet", "run", str(ab), "--workers", "1", "-q"]) == 0
    url = str(out / "ptestore-index.json")
    _, sharded, _ = open_index(url)
    assert sharded is not None
    model = sharded.model_dir("mlp")
    Path(f"{model}/t.json").unlink()
    capsys.readouterr()
    job = _job(tmp_path / "c.toml", out, ["c"])
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert (got["done"], got["failed"], got["index"]) == (1, 0, None)
    shards = sharded.layout["shards"]
    assert got["index_error"] == _refused(url, shards, _top(model)[1], "mlp")
    assert not Path(f"{model}/t.json").exists()


def _two_models_run(tmp_path: Path, lose: tuple[str, ...]) -> tuple[str, Any, Path]:
    """A real run of models mlp and other on devices a and b, then the top node (the
    only leaf) of each of ``lose`` lost; the index's URL, its shards and a job of
    device c of both models into the same index."""
    out = tmp_path / "out"
    both = ("mlp", "other")
    ab = _job(tmp_path / "ab.toml", out, ["a", "b"], both)
    assert main(["fleet", "run", str(ab), "--workers", "1", "-q"]) == 0
    url = str(out / "ptestore-index.json")
    _, sharded, _ = open_index(url)
    assert sharded is not None
    for model in lose:
        Path(f"{sharded.model_dir(model)}/t.json").unlink()
    return url, sharded, _job(tmp_path / "c.toml", out, ["c"], both)


def _model_error(url: str, sharded: Any, model: str) -> dict[str, Any]:
    problem = _top(sharded.model_dir(model))[1]
    error = _refused(url, sharded.layout["shards"], problem, model)
    return {"model": model, "device": None, "index": url, "error": error}


def test_a_run_names_the_index_error_of_each_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both models' top nodes lost: the run's result names each model's index error
    (``index_errors``: model, index URL, message; ``index_error`` joins the messages),
    in ``--json``, the ``--report`` JSON and page and one summary line each, exit 1.
    Before, only the first model's error was reported."""
    url, sharded, job = _two_models_run(tmp_path, ("mlp", "other"))
    capsys.readouterr()
    report = tmp_path / "report.json"
    assert (
        main(["fleet", "run", str(job), "--workers", "1", "--json", "--report", str(report)]) == 1
    )
    got = json.loads(capsys.readouterr().out)
    errors = [_model_error(url, sharded, m) for m in ("mlp", "other")]
    assert (got["done"], got["failed"], got["index"], got["index_shards"]) == (2, 0, None, None)
    assert got["index_errors"] == errors
    assert got["index_error"] == "; ".join(e["error"] for e in errors)
    shown = json.loads(report.read_text())
    assert (shown["index_errors"], shown["index_error"]) == (errors, got["index_error"])
    page = tmp_path / "report.html"  # skipped, refused again
    assert main(["fleet", "run", str(job), "--workers", "1", "--report", str(page)]) == 1
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"index not published for model {e['model']}: {e['error']}" for e in errors
    ]
    html = page.read_text()
    for e in errors:
        row = f'<tr class="job"><td>{e["model"]}</td><td>its index</td><td class=mono>'
        assert row + esc(e["error"]) + "</td></tr>" in html


def test_a_run_whose_one_model_fails_its_index_names_the_index_it_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mlp's top node lost, other's sound: other's entries published (the run's
    ``index`` its URL, ``index_shards`` what it wrote), mlp's index error named, exit 1.
    Before, the run reported no index, as if nothing had been indexed."""
    url, sharded, job = _two_models_run(tmp_path, ("mlp",))
    capsys.readouterr()
    assert main(["fleet", "run", str(job), "--workers", "1", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert (got["done"], got["index"]) == (2, url) and got["index_shards"]["written"] > 0
    assert got["index_errors"] == [_model_error(url, sharded, "mlp")]
    assert got["index_error"] == got["index_errors"][0]["error"]
    assert find_entry(url, "other", "c") is not None
    assert not Path(f"{sharded.model_dir('mlp')}/t.json").exists()


@pytest.mark.s3
def test_a_publish_refuses_a_lost_named_half_on_s3(s3_server: S3TestServer) -> None:
    """On moto and SeaweedFS: a half its split node names deleted, a publish into it
    refused, the half not created (a create by If-None-Match would have succeeded)."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    options = s3_server.storage_options
    shards, model = _index(url, options, listed=1)
    leaf, problem = _named_half(model)
    client = s3_server.client()
    key = f"{model}/t{leaf}.json".removeprefix(f"s3://{bucket}/")
    client.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", _hashed_below(leaf))], options)
    assert str(caught.value) == _refused(url, shards, problem)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key)
    assert listed.get("KeyCount", 0) == 0


def _split_since(url: str, options: dict[str, Any], lost_beside: str) -> tuple[str, str, str]:
    """Model m's top node holding one device, A, in leaves of 1 KiB (listed: 1); the
    devices B, whose hash begins with the other bit than A's (a publish of B splits the
    top node into two halves, both named), and N, a device never published whose hash
    begins as ``lost_beside``'s ("A" or "B") does."""
    names = [f"dev-{i}" for i in range(200)]
    a = names[0]
    b = next(n for n in names if device_bits(n)[0] != device_bits(a)[0])
    beside = {"A": a, "B": b}[lost_beside]
    new = next(n for n in names if n not in (a, b) and device_bits(n)[0] == device_bits(beside)[0])
    create_index(url, leaf_bytes=1024, listed=1, storage_options=options)
    publish_entries(url, [synthetic_entry("m", a, socs=1)], options)
    return a, b, new


def _lost_after_the_look_up(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    options: dict[str, Any],
    other: str,
    lose: Callable[[str], None],
) -> list[str]:
    """Between a publish's look-up of its devices (the top node, a leaf) and its leaf
    write, another run publishes ``other`` (the top node split, both halves named), and
    then the half the publish's device is below is lost (``lose(its URL)``): the write
    finds the top node split and looks its device up again below it. Returns the URLs
    lost."""
    real = ModelTrie._update_leaf
    lost: list[str] = []

    def update_leaf(self: ModelTrie, node: Node, changes: Any, *rest: Any) -> Any:
        if not lost:
            [device] = changes
            lost.append(self.url(device_bits(device)[0]))
            publish_entries(url, [synthetic_entry("m", other, socs=1)], options)
            lose(lost[0])
        return real(self, node, changes, *rest)

    monkeypatch.setattr(ModelTrie, "_update_leaf", update_leaf)
    return lost


@pytest.mark.parametrize("beside", ["A", "B"], ids=["listed-device", "named-half"])
def test_a_publish_refuses_a_leaf_lost_below_a_node_split_since_its_look_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beside: str
) -> None:
    """The half lost is A's (the device the catalog the publish read lists) or B's (named
    by the top node's split, B not listed in that catalog): the publish, looking its
    device up again below the top node another run split meanwhile, refuses it as its
    first look-up would have, and does not create the half (before: created holding N
    alone, A or B then "no entry")."""
    url = str(tmp_path / "ptestore-index.json")
    a, b, new = _split_since(url, {}, beside)
    lost = _lost_after_the_look_up(monkeypatch, url, {}, b, lambda u: Path(u).unlink())
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", new, socs=1)], {})
    monkeypatch.undo()
    _, sharded, _ = open_index(url)
    assert sharded is not None
    model, half = sharded.model_dir("m"), device_bits(new)[0]
    assert lost == [f"{model}/t{half}.json"] and not Path(lost[0]).exists()
    if beside == "A":
        problem = (
            f"{model}/catalog.json: index catalog classes[0].devices[0] = '{a}': must be a "
            "device whose entry is in one of the model's leaves (its leaf is "
            f"{model}/t{half}.json: not found: a leaf is missing (a writer updates the "
            "leaves before the catalog, and never removes an entry))"
        )
    else:
        problem = (
            f"{model}/t.json: index shard halves = ['0', '1']: must be halves that exist (a "
            "split creates the halves it names before it commits, and a node is never "
            f"removed) ({model}/t{half}.json is not found: a leaf is missing)"
        )
    assert str(caught.value) == _refused(url, sharded.layout["shards"], problem)
    with pytest.raises(FormatError):
        load_index(url)


@pytest.mark.s3
def test_a_publish_refuses_a_half_lost_since_its_look_up_on_s3(
    s3_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On moto and SeaweedFS: the half named by a split made after the publish's look-up
    deleted, refused when the publish looks its device up again, not created."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/fleet/ptestore-index.json"
    options = s3_server.storage_options
    client = s3_server.client()

    def delete(u: str) -> None:
        client.delete_object(Bucket=bucket, Key=u.removeprefix(f"s3://{bucket}/"))

    _, b, new = _split_since(url, options, "B")
    lost = _lost_after_the_look_up(monkeypatch, url, options, b, delete)
    with pytest.raises(FormatError) as caught:
        publish_entries(url, [synthetic_entry("m", new, socs=1)], options)
    monkeypatch.undo()
    assert "index shard halves = ['0', '1']: must be halves that exist" in str(caught.value)
    key = lost[0].removeprefix(f"s3://{bucket}/")
    assert client.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) == 0
