"""Keys a store may rewrite: the pair check compares what the store will address.

SeaweedFS stores ``p\\m.ptd`` as ``p/m.ptd`` and ``a//b`` as ``a/b`` (moto and AWS store
both literally): a destination spelled one way must never replace a source spelled the
other way, on any store."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from ptestore.cli import main
from ptestore.coordinator.targets import check_targets, same_target
from ptestore.errors import ConfigurationError
from ptestore.testing.s3server import S3TestServer
from ptestore.testing.seaweedfs import SeaweedS3

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

#: (spelling of a destination, spelling of the same stored object on some store)
ALIASES = [
    ("p\\m.ptd", "p/m.ptd"),
    ("p//m.ptd", "p/m.ptd"),
    ("p\\\\m.ptd", "p/m.ptd"),
    ("/p/m.ptd", "p/m.ptd"),
    ("p/./m.ptd", "p/m.ptd"),
    ("p/q/../m.ptd", "p/m.ptd"),
]


@pytest.mark.parametrize("scheme", ["s3", "memory"])
@pytest.mark.parametrize(("alias", "key"), ALIASES)
def test_spellings_a_store_folds_are_one_target(scheme: str, alias: str, key: str) -> None:
    assert same_target(f"{scheme}://src/{alias}", f"{scheme}://src/{key}")
    with pytest.raises(ConfigurationError) as info:
        check_targets(
            (f"{scheme}://src/m.pte", f"{scheme}://src/{alias}"),
            (f"{scheme}://src/{key}", f"{scheme}://out/m.ptd"),
        )
    assert str(info.value) == (
        f"the destination .pte and the source .ptd are the same file, {scheme}://src/{alias} "
        f"({scheme}://src/{key}): would replace the .ptd; every destination must differ from "
        "both sources and from the other destination"
    )


def test_local_spellings_are_one_target(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    target = tmp_path / "p" / "m.ptd"
    target.write_bytes(b"x")
    for alias in (f"{tmp_path}//p/m.ptd", f"{tmp_path}/p/./m.ptd", f"file://{tmp_path}/p/m.ptd"):
        assert same_target(alias, str(target))


@pytest.mark.s3
def test_the_store_folds_these_keys_or_stores_them_literally(s3_server: S3TestServer) -> None:
    """The fact behind the rule: SeaweedFS serves each alias as the folded key."""
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    for alias, _ in ALIASES[:4]:
        client.put_object(Bucket=bucket, Key=alias, Body=b"x")
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    if isinstance(s3_server, SeaweedS3):
        assert keys == ["p/m.ptd"]
    else:
        assert keys == sorted(a for a, _ in ALIASES[:4])


@pytest.mark.s3
def test_specialize_refuses_a_destination_that_aliases_the_source_ptd(
    s3_server: S3TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    pte = (FIXTURES / "mlp_xnnpack_ext.pte").read_bytes()
    ptd = (FIXTURES / "mlp_xnnpack_ext.ptd").read_bytes()
    client.put_object(Bucket=bucket, Key="p/m.pte", Body=pte)
    client.put_object(Bucket=bucket, Key="p/m.ptd", Body=ptd)
    opts = [f"--storage-option=endpoint_url={s3_server.storage_options['endpoint_url']}"]
    for k in ("key", "secret"):
        if k in s3_server.storage_options:
            opts.append(f"--storage-option={k}={s3_server.storage_options[k]}")
    code = main(
        [
            "specialize",
            f"s3://{bucket}/p/m.pte",
            f"s3://{bucket}/p\\m.ptd",
            "--ptd",
            f"s3://{bucket}/p/m.ptd",
            f"s3://{bucket}/out/m.ptd",
            "--backend",
            "passthrough",
            "--quiet",
            *opts,
        ]
    )
    assert code == 2
    assert "the destination .pte and the source .ptd are the same file" in capsys.readouterr().err
    assert client.get_object(Bucket=bucket, Key="p/m.ptd")["Body"].read() == ptd
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["p/m.ptd", "p/m.pte"]


def test_memory_store_refuses_too() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/alias/p/m.ptd", (FIXTURES / "mlp_xnnpack_ext.ptd").read_bytes())
    fs.pipe("/alias/p/m.pte", (FIXTURES / "mlp_xnnpack_ext.pte").read_bytes())
    code = main(
        [
            "specialize",
            "memory://alias/p/m.pte",
            "memory://alias/p//m.ptd",
            "--ptd",
            "memory://alias/p/m.ptd",
            "memory://alias/out/m.ptd",
            "--backend",
            "passthrough",
            "--quiet",
        ]
    )
    assert code == 2
    assert fs.cat("/alias/p/m.ptd") == (FIXTURES / "mlp_xnnpack_ext.ptd").read_bytes()
