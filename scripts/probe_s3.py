"""Probe the S3 behaviours ptestore depends on, with plain boto3, on moto and SeaweedFS.

    python scripts/probe_s3.py [--server moto|seaweedfs|both] [--rounds N]

Starts each server with ptestore's test helpers (moto with its default 5 MiB minimum
part size, so that moto's own rules show), runs every probe on a fresh bucket and prints
a Markdown table: one row per behaviour, one column per server, each cell the outcome
(HTTP status and error code, or what came back). docs/storage.md's table of "S3
behaviours ptestore depends on" was made with this script.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from botocore.exceptions import ClientError

from ptestore.testing.moto import moto_s3_server
from ptestore.testing.s3server import S3TestServer
from ptestore.testing.seaweedfs import seaweedfs_s3_server

MiB = 1 << 20
PART = 5 * MiB


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def err(exc: ClientError) -> str:
    meta = exc.response.get("ResponseMetadata", {})
    code = exc.response.get("Error", {}).get("Code", "?")
    return f"{meta.get('HTTPStatusCode', '?')} {code}"


def attempt(fn: Callable[[], Any]) -> str:
    """'ok' (or what ``fn`` returns, if a str) or the HTTP status and error code."""
    try:
        out = fn()
    except ClientError as exc:
        return err(exc)
    return out if isinstance(out, str) else "ok"


class Probe:
    def __init__(self, server: S3TestServer, rounds: int) -> None:
        self.c = server.client()
        self.endpoint = server.endpoint_url
        self.b = server.new_bucket()
        self.rounds = rounds
        self.n = 0

    def key(self) -> str:
        self.n += 1
        return f"probe/{self.n}"

    def mpu(self, key: str, parts: list[bytes], **create: Any) -> tuple[str, list[dict[str, Any]]]:
        up = self.c.create_multipart_upload(Bucket=self.b, Key=key, **create)["UploadId"]
        done = []
        for i, body in enumerate(parts, 1):
            extra = {"ChecksumCRC32": crc32_b64(body)} if "ChecksumAlgorithm" in create else {}
            r = self.c.upload_part(
                Bucket=self.b, Key=key, UploadId=up, PartNumber=i, Body=body, **extra
            )
            part = {"PartNumber": i, "ETag": r["ETag"]}
            if "ChecksumCRC32" in r and "ChecksumAlgorithm" in create:
                part["ChecksumCRC32"] = r["ChecksumCRC32"]
            done.append(part)
        return up, done

    def complete(self, key: str, up: str, parts: list[dict[str, Any]], **kw: Any) -> Any:
        return self.c.complete_multipart_upload(
            Bucket=self.b, Key=key, UploadId=up, MultipartUpload={"Parts": parts}, **kw
        )

    # -- conditional writes -------------------------------------------------------------

    def put_if_none_match_existing(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"old")
        return attempt(lambda: self.c.put_object(Bucket=self.b, Key=k, Body=b"x", IfNoneMatch="*"))

    def put_if_match_wrong(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"old")
        wrong = attempt(
            lambda: self.c.put_object(Bucket=self.b, Key=k, Body=b"x", IfMatch='"0" * 32')
        )
        missing = attempt(
            lambda: self.c.put_object(Bucket=self.b, Key=self.key(), Body=b"x", IfMatch='"abc"')
        )
        return f"wrong: {wrong}; missing key: {missing}"

    def complete_if_none_match_existing(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"old")
        up, parts = self.mpu(k, [b"a" * 10])
        return attempt(lambda: self.complete(k, up, parts, IfNoneMatch="*"))

    def complete_if_match_wrong(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"old")
        up, parts = self.mpu(k, [b"a" * 10])
        out = attempt(lambda: self.complete(k, up, parts, IfMatch='"' + "0" * 32 + '"'))
        body = self.c.get_object(Bucket=self.b, Key=k)["Body"].read()
        return f"{out}; object {'kept' if body == b'old' else 'replaced'}"

    def _race(self, publish: Callable[[int], Any], racers: int) -> tuple[int, set[str]]:
        barrier = threading.Barrier(racers)
        results: list[str] = [""] * racers

        def run(i: int) -> None:
            barrier.wait()
            results[i] = attempt(lambda: publish(i))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results.count("ok"), {r for r in results if r != "ok"}

    def _race_summary(self, rounds: list[tuple[int, set[str]]]) -> str:
        winners = sorted({w for w, _ in rounds})
        single = sum(w == 1 for w, _ in rounds)
        losers = set().union(*(lose for _, lose in rounds)) or {"none"}
        return (
            f"1 winner in {single}/{len(rounds)} rounds, winners seen {winners}; "
            f"losers: {', '.join(sorted(losers))}"
        )

    def put_race(self) -> str:
        rounds = []
        for _ in range(self.rounds):
            k = self.key()
            rounds.append(
                self._race(
                    lambda i, k=k: self.c.put_object(  # type: ignore[misc]
                        Bucket=self.b, Key=k, Body=bytes([65 + i]) * 1000, IfNoneMatch="*"
                    ),
                    4,
                )
            )
        return self._race_summary(rounds)

    def complete_race(self) -> str:
        rounds = []
        mixed = 0
        for _ in range(self.rounds):
            k = self.key()
            payloads = [[bytes([65 + i]) * PART] * 3 for i in range(4)]
            uploads = [self.mpu(k, p) for p in payloads]
            rounds.append(
                self._race(lambda i, k=k, u=uploads: self.complete(k, *u[i], IfNoneMatch="*"), 4)  # type: ignore[misc]
            )
            body = self.c.get_object(Bucket=self.b, Key=k)["Body"].read()
            mixed += body not in {b"".join(p) for p in payloads}
        return self._race_summary(rounds) + f"; mixed objects: {mixed}"

    def get_if_match_wrong(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"data")
        return attempt(lambda: self.c.get_object(Bucket=self.b, Key=k, IfMatch='"nope"'))

    # -- UploadPartCopy -----------------------------------------------------------------

    def _copy(self, **kw: Any) -> str:
        src = self.key()
        self.c.put_object(Bucket=self.b, Key=src, Body=b"s" * 1000)
        dst = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=dst)["UploadId"]
        out = attempt(
            lambda: self.c.upload_part_copy(
                Bucket=self.b,
                Key=dst,
                UploadId=up,
                PartNumber=1,
                CopySource={"Bucket": self.b, "Key": src},
                **kw,
            )
        )
        if out == "ok" and "CopySourceRange" in kw:
            listed = self.c.list_parts(Bucket=self.b, Key=dst, UploadId=up)["Parts"]
            parts = [{"PartNumber": 1, "ETag": listed[0]["ETag"]}]
            self.complete(dst, up, parts)
            size = self.c.head_object(Bucket=self.b, Key=dst)["ContentLength"]
            return f"ok, part of {size} bytes"
        self.c.abort_multipart_upload(Bucket=self.b, Key=dst, UploadId=up)
        return out

    def copy_if_match_wrong(self) -> str:
        return self._copy(CopySourceIfMatch='"' + "0" * 32 + '"')

    def copy_if_match_right(self) -> str:
        src = self.key()
        etag = self.c.put_object(Bucket=self.b, Key=src, Body=b"s" * 1000)["ETag"]
        dst = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=dst)["UploadId"]
        out = attempt(
            lambda: self.c.upload_part_copy(
                Bucket=self.b,
                Key=dst,
                UploadId=up,
                PartNumber=1,
                CopySource={"Bucket": self.b, "Key": src},
                CopySourceIfMatch=etag,
                CopySourceRange="bytes=10-19",
            )
        )
        self.c.abort_multipart_upload(Bucket=self.b, Key=dst, UploadId=up)
        return out

    def copy_range_beyond_eof(self) -> str:
        return self._copy(CopySourceRange="bytes=500-1999")

    # -- checksums ----------------------------------------------------------------------

    def part_crc_wrong(self) -> str:
        k = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=k, ChecksumAlgorithm="CRC32")[
            "UploadId"
        ]
        out = attempt(
            lambda: self.c.upload_part(
                Bucket=self.b,
                Key=k,
                UploadId=up,
                PartNumber=1,
                Body=b"x" * 100,
                ChecksumCRC32=crc32_b64(b"y"),
            )
        )
        self.c.abort_multipart_upload(Bucket=self.b, Key=k, UploadId=up)
        return out

    def put_crc_wrong(self) -> str:
        return attempt(
            lambda: self.c.put_object(
                Bucket=self.b, Key=self.key(), Body=b"x" * 100, ChecksumCRC32=crc32_b64(b"y")
            )
        )

    def composite_checksum(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * PART, b"b" * 10], ChecksumAlgorithm="CRC32")
        r = self.complete(k, up, parts)
        head = self.c.head_object(Bucket=self.b, Key=k, ChecksumMode="ENABLED")
        return (
            f"Complete: {r.get('ChecksumCRC32')} {r.get('ChecksumType')}; "
            f"HEAD: {head.get('ChecksumCRC32')} {head.get('ChecksumType')}"
        )

    def full_object_checksum(self, *, right: bool) -> str:
        k = self.key()
        data = [b"a" * PART, b"b" * 10]
        up, parts = self.mpu(k, data, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
        crc = crc32_b64(b"".join(data) if right else b"wrong")
        out = attempt(
            lambda: self.complete(k, up, parts, ChecksumCRC32=crc, ChecksumType="FULL_OBJECT")
        )
        if out != "ok":
            self.c.abort_multipart_upload(Bucket=self.b, Key=k, UploadId=up)
            return out
        head = self.c.head_object(Bucket=self.b, Key=k, ChecksumMode="ENABLED")
        got = head.get("ChecksumCRC32")
        return f"ok; HEAD: {got} {head.get('ChecksumType')} ({'=' if got == crc else '!='} sent)"

    def full_object_checksum_right(self) -> str:
        return self.full_object_checksum(right=True)

    def full_object_checksum_wrong(self) -> str:
        return self.full_object_checksum(right=False)

    def default_checksum_single_put(self) -> str:
        k = self.key()
        self.c.put_object(Bucket=self.b, Key=k, Body=b"abc")
        head = self.c.head_object(Bucket=self.b, Key=k, ChecksumMode="ENABLED")
        found = {n: v for n, v in head.items() if n.startswith("Checksum")}
        return str(found or "none")

    # -- upload life cycle --------------------------------------------------------------

    def after_abort(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * 10])
        self.c.abort_multipart_upload(Bucket=self.b, Key=k, UploadId=up)
        part = attempt(
            lambda: self.c.upload_part(
                Bucket=self.b, Key=k, UploadId=up, PartNumber=2, Body=b"late"
            )
        )
        again = attempt(lambda: self.c.abort_multipart_upload(Bucket=self.b, Key=k, UploadId=up))
        lp = attempt(lambda: self.c.list_parts(Bucket=self.b, Key=k, UploadId=up))
        comp = attempt(lambda: self.complete(k, up, parts))
        return f"UploadPart: {part}; Abort: {again}; ListParts: {lp}; Complete: {comp}"

    def complete_twice(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * 10])
        self.complete(k, up, parts)
        return attempt(lambda: self.complete(k, up, parts))

    def complete_descending(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * PART, b"b" * PART])
        return attempt(lambda: self.complete(k, up, parts[::-1]))

    def small_part(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * 100, b"b" * 10])
        return attempt(lambda: self.complete(k, up, parts))

    def gaps_and_marker_part(self) -> str:
        k = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=k)["UploadId"]
        parts = []
        for n, body in ((3, b"a" * PART), (10000, b"z")):
            r = self.c.upload_part(Bucket=self.b, Key=k, UploadId=up, PartNumber=n, Body=body)
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        out = attempt(lambda: self.complete(k, up, parts))
        if out != "ok":
            return out
        size = self.c.head_object(Bucket=self.b, Key=k)["ContentLength"]
        return f"ok, {size} bytes"

    def part_number_too_big(self) -> str:
        k = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=k)["UploadId"]
        return attempt(
            lambda: self.c.upload_part(
                Bucket=self.b, Key=k, UploadId=up, PartNumber=10001, Body=b"x"
            )
        )

    def mpu_object_size_wrong(self) -> str:
        k = self.key()
        up, parts = self.mpu(k, [b"a" * 10])
        return attempt(lambda: self.complete(k, up, parts, MpuObjectSize=11))

    def list_uploads(self) -> str:
        base = self.key()
        ups = [
            self.c.create_multipart_upload(Bucket=self.b, Key=f"{base}/{i}")["UploadId"]
            for i in range(3)
        ]
        listed = self.c.list_multipart_uploads(Bucket=self.b, Prefix=f"{base}/")
        mine = {u["UploadId"] for u in listed.get("Uploads", [])}
        page = self.c.list_multipart_uploads(Bucket=self.b, Prefix=f"{base}/", MaxUploads=2)
        for i, up in enumerate(ups):
            self.c.abort_multipart_upload(Bucket=self.b, Key=f"{base}/{i}", UploadId=up)
        after = self.c.list_multipart_uploads(Bucket=self.b, Prefix=f"{base}/").get("Uploads", [])
        return (
            f"{len(mine & set(ups))}/3 listed; MaxUploads=2 gave "
            f"{len(page.get('Uploads', []))} (IsTruncated={page.get('IsTruncated')}); "
            f"{len(after)} after abort"
        )

    def initiated_and_metadata(self) -> str:
        k = self.key()
        up = self.c.create_multipart_upload(Bucket=self.b, Key=k, Metadata={"ptestore-writer": "t"})
        listed = self.c.list_multipart_uploads(Bucket=self.b, Prefix=k).get("Uploads", [])
        initiated = listed[0].get("Initiated") if listed else None
        r = self.c.upload_part(
            Bucket=self.b, Key=k, UploadId=up["UploadId"], PartNumber=1, Body=b"x"
        )
        self.complete(k, up["UploadId"], [{"PartNumber": 1, "ETag": r["ETag"]}])
        meta = self.c.head_object(Bucket=self.b, Key=k)["Metadata"]
        return f"Initiated: {'yes' if initiated else 'no'}; metadata after Complete: {meta}"

    def missing_bucket(self) -> str:
        missing = f"no-such-bucket-{self.n}-{id(self)}"
        return attempt(lambda: self.c.put_object(Bucket=missing, Key="k", Body=b"x"))

    def wrong_credentials(self) -> str:
        import boto3

        bad = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="not-a-key",
            aws_secret_access_key="not-a-secret",
            region_name="us-east-1",
        )
        return attempt(lambda: bad.put_object(Bucket=self.b, Key=self.key(), Body=b"x"))

    # -- reads and ETags ----------------------------------------------------------------

    def ranged_get(self) -> str:
        k = self.key()
        data = bytes(range(256)) * 4
        self.c.put_object(Bucket=self.b, Key=k, Body=data)
        r = self.c.get_object(Bucket=self.b, Key=k, Range="bytes=10-19")
        ok = r["Body"].read() == data[10:20]
        suffix = self.c.get_object(Bucket=self.b, Key=k, Range="bytes=-5")["Body"].read()
        past = attempt(lambda: self.c.get_object(Bucket=self.b, Key=k, Range="bytes=5000-5001"))
        over = self.c.get_object(Bucket=self.b, Key=k, Range="bytes=1020-2000")["Body"].read()
        return (
            f"{r['ResponseMetadata']['HTTPStatusCode']} {'right bytes' if ok else 'WRONG'}, "
            f"{r.get('ContentRange')}; suffix ok: {suffix == data[-5:]}; "
            f"past EOF: {past}; overlapping EOF: {len(over)} bytes"
        )

    def etags(self) -> str:
        k = self.key()
        body = b"hello"
        single = self.c.put_object(Bucket=self.b, Key=k, Body=body)["ETag"].strip('"')
        k2 = self.key()
        data = [b"a" * PART, b"b" * 10]
        up, parts = self.mpu(k2, data)
        multi = self.complete(k2, up, parts)["ETag"].strip('"')
        want = hashlib.md5(b"".join(hashlib.md5(d).digest() for d in data)).hexdigest() + "-2"
        return (
            f"PUT: {'md5' if single == hashlib.md5(body).hexdigest() else single}; "
            f"MPU: {'md5-of-md5s-N' if multi == want else multi}"
        )


PROBES: list[tuple[str, str]] = [
    ("put_if_none_match_existing", "PutObject If-None-Match: * over an existing key"),
    ("put_if_match_wrong", "PutObject If-Match: wrong ETag / on a missing key"),
    ("put_race", "4 racing PutObject If-None-Match: *, new key"),
    ("complete_if_none_match_existing", "Complete If-None-Match: * over an existing key"),
    ("complete_if_match_wrong", "Complete If-Match: wrong ETag"),
    ("complete_race", "4 racing Completes If-None-Match: *, new key, 3 x 5 MiB parts"),
    ("get_if_match_wrong", "GetObject If-Match: wrong ETag"),
    ("copy_if_match_wrong", "UploadPartCopy CopySourceIfMatch: wrong ETag"),
    ("copy_if_match_right", "UploadPartCopy CopySourceIfMatch: right ETag, a range"),
    ("copy_range_beyond_eof", "UploadPartCopy range beyond the source's end"),
    ("part_crc_wrong", "UploadPart with a wrong ChecksumCRC32"),
    ("put_crc_wrong", "PutObject with a wrong ChecksumCRC32"),
    ("composite_checksum", "CRC32 (COMPOSITE) multipart: checksum returned"),
    ("full_object_checksum_right", "CRC32 FULL_OBJECT multipart, right value"),
    ("full_object_checksum_wrong", "CRC32 FULL_OBJECT multipart, wrong value at Complete"),
    ("default_checksum_single_put", "PutObject without a checksum: HEAD ChecksumMode"),
    ("after_abort", "after AbortMultipartUpload"),
    ("complete_twice", "Complete repeated after success"),
    ("complete_descending", "Complete with a descending part list"),
    ("small_part", "non-last part of 100 bytes"),
    ("gaps_and_marker_part", "parts 3 and 10000 only (gaps, ptestore's marker part)"),
    ("part_number_too_big", "part number 10001"),
    ("mpu_object_size_wrong", "Complete with a wrong MpuObjectSize"),
    ("list_uploads", "ListMultipartUploads with Prefix, MaxUploads"),
    ("initiated_and_metadata", "upload Initiated time; metadata of a multipart object"),
    ("missing_bucket", "PutObject into a missing bucket"),
    ("wrong_credentials", "PutObject with unknown credentials"),
    ("ranged_get", "ranged GET"),
    ("etags", "ETag of PutObject / multipart object"),
]


@contextmanager
def _moto() -> Iterator[S3TestServer]:
    with moto_s3_server(min_part_size=None) as s:  # moto's own 5 MiB rule
        yield s


SERVERS: dict[str, Callable[[], AbstractContextManager[S3TestServer]]] = {
    "moto": _moto,
    "seaweedfs": seaweedfs_s3_server,
}


def run(names: list[str], rounds: int, only: list[str] | None = None) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}
    for name in names:
        with SERVERS[name]() as server:
            probe = Probe(server, rounds)
            results[name] = []
            for method, _ in PROBES:
                if only and method not in only:
                    results[name].append("-")
                    continue
                try:
                    results[name].append(getattr(probe, method)())
                except Exception as exc:  # a probe's own setup step failed
                    results[name].append(f"setup failed: {type(exc).__name__}: {exc}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each race")
    parser.add_argument("--only", nargs="*", help="probe method names to run")
    args = parser.parse_args(argv)
    names = list(SERVERS) if args.server == "both" else [args.server]
    results = run(names, args.rounds, args.only)
    print("| behaviour | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, (_, title) in enumerate(PROBES):
        print(f"| {title} | " + " | ".join(results[n][i] for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
