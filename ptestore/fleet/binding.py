"""Is a destination's bytes the ones its provenance record names?

The record holds the SHA-256 and the CRCs of the bytes before the trailer (``content``:
CRC-32, and where ``awscrt`` was installed CRC-32C and CRC64NVME, whole and per 4 MiB
chunk, :mod:`ptestore.provenance.crcs`). How each store is checked without trusting the
record alone:

- **S3**: a ``HEAD`` with ``ChecksumMode=ENABLED`` (:func:`trust_by_head`). The checksum
  S3 keeps was checked by S3 against the bytes it received; when it equals the one the
  record implies (the content's CRCs combined with the trailer's bytes), the object is
  trusted without downloading it:

  - a full-object CRC-32, CRC-32C or CRC64NVME (ptestore's own uploads; S3's default for
    uploads without a checksum): compared with the record's whole-content CRC;
  - a composite CRC (``<base64>-<parts>``: boto3's ``upload_file``, the AWS CLI):
    the part sizes are asked of S3 (``GetObjectAttributes``, else ``HEAD`` of part 1),
    and each part's CRC predicted from the record's chunk CRCs: every part boundary
    inside the content must lie on the 4 MiB chunk grid (8 MiB parts do; 5 MiB parts do
    not). Where S3 lists each part's checksum (AWS), those are combined instead, and no
    chunk CRC is needed;
  - a full-object SHA-256 (a single PutObject with ``ChecksumAlgorithm=SHA256``): only
    for an object that is its content (a shared ``.ptd``, no trailer).

  Anything else (no checksum stored, SHA-1, a composite SHA-256, an algorithm the record
  lacks, parts off the grid, an answer that cannot be had) is read once in full and its
  SHA-256 compared instead.
- **local files and every other store**: a full read and the SHA-256.

A stored checksum that differs from the prediction is a mismatch when S3 says which
kind it is (``ChecksumType``, or the ``-N`` of a composite on parts S3 listed);
otherwise (a server that names no type, a part grid inferred from part 1) the bytes are
read to decide, as is a stored value that is not the algorithm's (malformed: it proves
nothing either way). The CRCs catch damage and any rewrite by ordinary tools; they are no
defence against someone who can write the bucket and forges a matching CRC on purpose
(``ptestore verify`` compares the SHA-256 with a full read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .._dataclass import dataclass
from ..checksums import CRC_ALGORITHMS, ExpectedChecksums, combine_all, composite, decode, encode
from ..errors import FormatError, ObjectNotFound
from ..provenance.crcs import expected_checksums
from ..provenance.digest import content_digest
from ..provenance.record import ContentDigest, Provenance, ProvenanceKey
from ..provenance.trailer import Trailer, read_trailer
from ..storage.s3checksum import ObjectParts, s3_object
from ..storage.types import DataLoader

__all__ = [
    "HeadVerdict",
    "bytes_mismatch",
    "check_artifact",
    "content_verdict",
    "trust_by_head",
]


@dataclass(frozen=True)
class HeadVerdict:
    """What the stored checksum says: ``trusted`` True (the bytes are the expected
    ones), False (they are not: ``reason``), or None (undecided: read the bytes)."""

    trusted: bool | None
    reason: str
    #: The stored checksum, as S3 reported it (None when there was none).
    stored: str | None = None
    #: Requests made to decide.
    requests: int = 0


def trust_by_head(loader: DataLoader, expected: ExpectedChecksums) -> HeadVerdict:
    """Judge the object behind ``loader`` by the checksum S3 keeps for it, against
    ``expected`` (see the module's docstring)."""
    obj = s3_object(loader)
    if obj is None:
        return HeadVerdict(None, "not an S3 object")
    stored = obj.checksum()

    def verdict(trusted: bool | None, reason: str) -> HeadVerdict:
        return HeadVerdict(trusted, reason, None if stored is None else str(stored), obj.requests)

    if stored is None:
        return verdict(None, "no checksum stored (or the object changed)")
    if obj.size != expected.size:
        return verdict(False, f"{loader.name} has {obj.size} bytes, not {expected.size}")
    algorithm = stored.algorithm
    if decode(algorithm, stored.value) is None:  # proves nothing either way: read
        return verdict(None, f"the stored {algorithm} {stored.value!r} is malformed")
    if not stored.composite:
        want = expected.full(algorithm)
        if want is not None and encode(algorithm, want) == stored.value:
            return verdict(True, f"stored {algorithm} matches")
        if want is not None and stored.full_object:
            return verdict(
                False,
                f"{loader.name}: the stored {algorithm} {stored.value} is not the "
                f"{encode(algorithm, want)} its record implies: the bytes were damaged or "
                "changed after they were made",
            )
        if want is None and (stored.full_object or algorithm not in CRC_ALGORITHMS):
            return verdict(None, f"the record gives no {algorithm} of these bytes")
    if algorithm not in CRC_ALGORITHMS:
        return verdict(None, f"a composite {algorithm} cannot be predicted")
    parts = obj.parts(algorithm)
    if parts is None:
        return verdict(None, "the object's parts are unknown")
    count = stored.parts or len(parts.sizes)
    if count != len(parts.sizes) or sum(parts.sizes) != expected.size:
        return verdict(None, "the parts listed do not make up the object")
    got = f"{stored.value}-{count}"
    listed = _listed_parts(algorithm, parts, expected, got)
    if listed is not None:
        return verdict(*listed)
    values = expected.parts(algorithm, parts.sizes)
    if values is None:
        return verdict(
            None, f"a part boundary falls inside a chunk the record has no {algorithm} of"
        )
    want_composite = composite(algorithm, values)
    if want_composite == got:
        return verdict(True, f"stored composite {algorithm} matches")
    if stored.composite and not parts.assumed:
        return verdict(
            False,
            f"{loader.name}: the stored composite {algorithm} {got} is not the "
            f"{want_composite} its record implies: the bytes were damaged or changed after "
            "they were made",
        )
    return verdict(None, "the checksum differs on a part grid that was only inferred")


def _listed_parts(
    algorithm: str, parts: ObjectParts, expected: ExpectedChecksums, got: str
) -> tuple[bool, str] | None:
    """Judge by the part checksums S3 listed (AWS): they make up the stored composite,
    and combined they give the whole object's CRC."""
    values = [None if v is None else decode(algorithm, v) for v in parts.checksums]
    want = expected.full(algorithm)
    if want is None or any(not isinstance(v, int) for v in values):
        return None
    ints = [v for v in values if isinstance(v, int)]
    if composite(algorithm, ints) != got:
        return None  # not the parts of this checksum: decide otherwise
    whole = combine_all(algorithm, list(zip(ints, parts.sizes, strict=True)))
    if whole == want:
        return True, f"the listed part {algorithm}s make up the expected bytes"
    return False, (
        f"the listed part {algorithm}s make up {encode(algorithm, whole)}, not the "
        f"{encode(algorithm, want)} the record implies: the bytes were damaged or changed "
        "after they were made"
    )


def bytes_mismatch(loader: DataLoader, trailer: Trailer, prov: Provenance) -> str | None:
    """Why the object's bytes are not the ones ``prov`` names, or None when they are."""
    if prov.content is None:
        return (
            f"{loader.name}: the record names no digest of its bytes (made by an older "
            "ptestore); nothing binds it to this file"
        )
    verdict = trust_by_head(loader, expected_checksums(prov.content, trailer.raw()))
    if verdict.trusted is not None:
        return None if verdict.trusted else verdict.reason
    got = content_digest(loader, trailer.content_size, like=prov.content.sha256)
    if got.sha256 != prov.content.sha256:
        return (
            f"{loader.name}: the bytes before the trailer have {got.sha256}, the provenance "
            f"records {prov.content.sha256}: damaged or changed after they were made"
        )
    return None


def content_verdict(loader: DataLoader, content: ContentDigest) -> HeadVerdict:
    """:func:`trust_by_head` for an object that is exactly ``content`` (no trailer)."""
    return trust_by_head(loader, expected_checksums(content, whole=True))


def check_artifact(
    urls: list[str],
    open_: Callable[[str], DataLoader],
    want: ProvenanceKey,
    ptd_check: Callable[[str, Provenance], tuple[bool, str]] | None = None,
    published: Mapping[str, str] | None = None,
    records: list[Provenance] | None = None,
) -> tuple[bool, str]:
    """``(current, reason)`` for the artifact at ``urls`` (the .pte, then its .ptd):
    each file has a valid trailer whose key is ``want`` and whose bytes are the ones it
    names, and the .pte's record names this very .ptd. With ``ptd_check``, ``urls`` is
    the .pte alone and ``ptd_check(url, record)`` checks the .ptd its record names
    (one stored once by content, :func:`.shared.check_shared_ptd`). ``published``: the
    content digest this process just published at a URL (``{url: "sha256-tree:..."}``):
    a file there whose record names that digest is taken as the bytes the run wrote,
    not read again (a run that publishes a 1 GiB local file would otherwise read and
    hash all of it a second time; another run's file has another record). ``records``:
    each file's record read is appended to it (the .pte's first)."""
    contents: list[ContentDigest | None] = []
    if records is None:
        records = []
    for url in urls:
        try:
            loader = open_(url)
        except ObjectNotFound:
            return False, f"no artifact at {url}"
        try:
            trailer = read_trailer(loader)
            if trailer is None:
                return False, f"{url} has no provenance trailer"
            prov = Provenance.of_trailer(trailer, loader.name)
            diff = prov.key().mismatches(want)
            if diff:
                return False, f"stale: {'; '.join(diff)}"
            written = None if published is None else published.get(url)
            if prov.content is None or written != prov.content.sha256:
                bad = bytes_mismatch(loader, trailer, prov)
                if bad is not None:
                    return False, bad
        except FormatError as exc:
            return False, f"damaged provenance trailer: {exc}"
        finally:
            loader.close()
        contents.append(prov.content)
        records.append(prov)
    if ptd_check is not None:
        return ptd_check(urls[0], records[0])
    if len(urls) > 1 and records[0].ptd_output != contents[1]:
        return False, (
            f"{urls[1]} is not the .ptd {urls[0]} was made with: it belongs to another "
            "pair or device"
        )
    return True, "current: provenance and bytes match"
