"""What a URL shows and what it names (``ptestore.storage.types``): ``redacted_url`` (the
form every message, record, report and manifest takes: credentials replaced by
``REDACTED``), ``url_identity`` (the device cache's key: without them) and
``redact_urls`` (every URL in a message); and the remote loader, whose ``name`` is the
redacted form while its reads carry the credentials (a real HTTP store on 127.0.0.1
that refuses a request without them)."""

from __future__ import annotations

from typing import Any

import pytest
from support.fixtures import get_fixture
from support.presigned import SECRETS, SIGNATURES, presigned_store

from ptestore._retry import to_storage_error
from ptestore.errors import ObjectNotFound, PermissionDenied
from ptestore.storage.loaders import open_loader
from ptestore.storage.types import (
    REDACTED,
    is_redacted,
    loader_url,
    redact_urls,
    redacted_url,
    url_identity,
)

SIGV4 = (
    "https://bucket.s3.amazonaws.com/models/m.pte?versionId=3HL4kqtJ&X-Amz-Algorithm="
    "AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20250101%2Fus-east-1%2Fs3"
    "%2Faws4_request&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders="
    "host&X-Amz-Security-Token=FwoGZXIvYXdzEXAMPLE&X-Amz-Signature=d1f2e3c4b5a6&x-id=GetObject"
)


def test_a_sigv4_presigned_url_shows_no_credential_and_keeps_the_rest() -> None:
    assert redacted_url(SIGV4) == (
        "https://bucket.s3.amazonaws.com/models/m.pte?versionId=3HL4kqtJ&X-Amz-Algorithm="
        "AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Date=20250101T000000Z"
        "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=REDACTED"
        "&X-Amz-Signature=REDACTED&x-id=GetObject"
    )
    # the identity: the object (and its version), nothing of the signing
    assert url_identity(SIGV4) == "https://bucket.s3.amazonaws.com/models/m.pte?versionId=3HL4kqtJ"


@pytest.mark.parametrize(
    ("url", "shown", "identity"),
    [
        # user information: all of it (a user name alone may be a token)
        (
            "http://alice:PASSWORD@host:8080/m.pte",
            "http://REDACTED@host:8080/m.pte",
            "http://host:8080/m.pte",
        ),
        ("https://ghp_TOKEN@host/m.pte", "https://REDACTED@host/m.pte", "https://host/m.pte"),
        # an '@' in the path is not user information; the last '@' of the authority ends it
        ("https://host/a/b@c.pte", "https://host/a/b@c.pte", "https://host/a/b@c.pte"),
        ("https://u:p@ss@host/m.pte", "https://REDACTED@host/m.pte", "https://host/m.pte"),
        # SigV2, in any case
        (
            "https://h/m.pte?awsaccesskeyid=AK&Expires=1700000000&SIGNATURE=abc",
            "https://h/m.pte?awsaccesskeyid=REDACTED&Expires=1700000000&SIGNATURE=REDACTED",
            "https://h/m.pte",
        ),
        # GCS V4
        (
            "https://storage.googleapis.com/b/m.pte?X-Goog-Algorithm=GOOG4-RSA-SHA256"
            "&X-Goog-Credential=sa%40p.iam%2F20250101&X-Goog-Date=20250101T000000Z"
            "&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=0a1b",
            "https://storage.googleapis.com/b/m.pte?X-Goog-Algorithm=GOOG4-RSA-SHA256"
            "&X-Goog-Credential=REDACTED&X-Goog-Date=20250101T000000Z"
            "&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=REDACTED",
            "https://storage.googleapis.com/b/m.pte",
        ),
        # Azure SAS: sig redacted; with it, the SAS fields are not the object's identity
        (
            "https://a.blob.core.windows.net/c/m.pte?sv=2022-11-02&se=2025-01-01&sr=b&sp=r"
            "&sig=AbC%2Bd%3D",
            "https://a.blob.core.windows.net/c/m.pte?sv=2022-11-02&se=2025-01-01&sr=b&sp=r"
            "&sig=REDACTED",
            "https://a.blob.core.windows.net/c/m.pte",
        ),
        # generic names; a percent-encoded name too; other parameters kept in order
        (
            "https://h/m.pte?a=1&access_token=t&api_key=k&Password=p&b=2&client_secret=s"
            "&X%2DAmz%2DSignature=x",
            "https://h/m.pte?a=1&access_token=REDACTED&api_key=REDACTED&Password=REDACTED&b=2"
            "&client_secret=REDACTED&X%2DAmz%2DSignature=REDACTED",
            "https://h/m.pte?a=1&b=2",
        ),
        # nothing to hide: as given (also short names that are SAS fields elsewhere)
        ("https://h/m.pte?sp=r&st=1", "https://h/m.pte?sp=r&st=1", "https://h/m.pte?sp=r&st=1"),
        (
            "s3://bucket/m.pte?versionId=1",
            "s3://bucket/m.pte?versionId=1",
            "s3://bucket/m.pte?versionId=1",
        ),
        ("memory://m.pte", "memory://m.pte", "memory://m.pte"),
        # a fragment is not the query
        ("https://h/m.pte#token=x", "https://h/m.pte#token=x", "https://h/m.pte#token=x"),
        # local paths and file:// URLs are never touched
        (
            "/data/alice:pw@x/m.pte?token=1",
            "/data/alice:pw@x/m.pte?token=1",
            "/data/alice:pw@x/m.pte?token=1",
        ),
        ("file:///d/m.pte?token=1", "file:///d/m.pte?token=1", "file:///d/m.pte?token=1"),
        ("LOCAL://u:p@d/m.pte", "LOCAL://u:p@d/m.pte", "LOCAL://u:p@d/m.pte"),
    ],
)
def test_what_is_shown_and_what_is_named(url: str, shown: str, identity: str) -> None:
    assert redacted_url(url) == shown
    assert url_identity(url) == identity
    # shown again: the same; its identity: the original's (a manifest's URL keys alike)
    assert redacted_url(shown) == shown
    assert url_identity(shown) == identity


def test_urls_in_a_message_are_redacted_and_its_words_kept() -> None:
    message = (
        "http://alice:PASSWORD@h:1/m.pte?sig=S1: read failed: 403, message='Forbidden', "
        "url=URL('http://alice:PASSWORD@h:1/m.pte?X-Amz-Signature=S2'); see "
        "https://h/doc?token=T3. Local /tmp/a?token=kept stays."
    )
    assert redact_urls(message) == (
        "http://REDACTED@h:1/m.pte?sig=REDACTED: read failed: 403, message='Forbidden', "
        "url=URL('http://REDACTED@h:1/m.pte?X-Amz-Signature=REDACTED'); see "
        "https://h/doc?token=REDACTED. Local /tmp/a?token=kept stays."
    )
    assert redact_urls("no URL here") == "no URL here"


def test_storage_errors_made_from_a_client_message_show_no_credential() -> None:
    exc = OSError("GET http://bob:PASS@h/m.pte?X-Amz-Signature=SIG failed")
    err = to_storage_error(exc, "http://bob:PASS@h/m.pte?X-Amz-Signature=SIG", "read")
    assert str(err) == (
        f"http://{REDACTED}@h/m.pte?X-Amz-Signature={REDACTED}: read failed: GET "
        f"http://{REDACTED}@h/m.pte?X-Amz-Signature={REDACTED} failed"
    )


def test_the_loader_shows_the_redacted_url_and_reads_with_the_real_one() -> None:
    data = get_fixture("mlp_portable").pte_path.read_bytes()  # type: ignore[union-attr]
    with presigned_store({"/m.pte": data}) as store:
        url = store.url("/m.pte")
        loader = open_loader(url)
        try:
            assert loader.name == redacted_url(url)
            assert not [s for s in SECRETS if s in loader.name]
            assert bytes(loader.load(0, loader.size())) == data
        finally:
            loader.close()
        # every request carried the credentials the store issued (else 401/403)
        assert store.seen and all(f"X-Amz-Signature={SIGNATURES[0]}" in p for p, _ in store.seen)
        assert all(a is not None for _, a in store.seen)
        # the name it shows cannot be opened: the credentials are not in it (the store's
        # 401, a PermissionDenied: was "no such object", fsspec's word for any failure)
        with pytest.raises(PermissionDenied) as refused:
            open_loader(loader.name)
        assert str(refused.value) == f"{loader.name}: stat failed: HTTP 401: Unauthorized"
        assert not [s for s in SECRETS if s in str(refused.value)]
        assert [p for p, _ in store.seen][-1].endswith("X-Amz-Signature=REDACTED")
        missing = store.url("/missing.pte")
        with pytest.raises(ObjectNotFound) as gone:
            open_loader(missing)
        assert str(gone.value) == f"{redacted_url(missing)}: no such object"


# ------------------------------------------- what is a credential, and what compares


@pytest.mark.parametrize(
    "url",
    [
        "abfs://models-prod@acct.dfs.core.windows.net/m.pte",  # adlfs: the container
        "abfss://models-test@acct.dfs.core.windows.net/m.pte",
        "az://c@acct.blob.core.windows.net/m.pte",
        "github://org:repo@main/models/m.pte",  # fsspec: the repository and its ref
        "memory://u:pw@h/m.pte",
    ],
)
def test_user_information_is_kept_where_it_is_not_a_credential(url: str) -> None:
    """Before, any ``@`` in the authority was a password: an abfs container was lost
    (two containers one identity, one cache entry for two objects)."""
    assert redacted_url(url) == url and url_identity(url) == url


@pytest.mark.parametrize(
    "scheme",
    [
        *("http", "HTTPS", "ftp", "ftps", "sftp", "ssh", "smb", "webdav"),
        # fsspec's gist://:TOKEN@id, webhdfs/hdfs user:password, an unknown protocol's:
        # shown whole while the rule named the protocols that send credentials
        *("gist", "webhdfs", "hdfs", "sync-http", "mystery"),
    ],
)
def test_user_information_is_a_credential_on_the_protocols_that_send_it(scheme: str) -> None:
    assert redacted_url(f"{scheme}://u:pw@h/m.pte") == f"{scheme}://REDACTED@h/m.pte"
    assert url_identity(f"{scheme}://u:pw@h/m.pte") == f"{scheme}://h/m.pte"


def test_two_abfs_containers_are_two_cache_entries_with_the_keys_they_had() -> None:
    from ptestore.device.keys import entry_key, key_digest

    prod, test = (f"abfs://models-{c}@acct.dfs.core.windows.net/m.pte" for c in ("prod", "test"))
    keys = [entry_key(u, None, None, None, False) for u in (prod, test)]
    assert keys[0] != keys[1]
    # "A URL without credentials has the key it had before" (its location as given)
    before = [key_digest(["ptestore.ensure/1", u, None, None, None, False]) for u in (prod, test)]
    assert keys == before


def test_is_redacted_tells_a_recorded_url_from_one_that_names_redacted() -> None:
    assert is_redacted(redacted_url(SIGV4)) and is_redacted("http://REDACTED@h/m.pte")
    assert not is_redacted(SIGV4)
    assert not is_redacted("/data/REDACTED.pte") and not is_redacted("s3://b/REDACTED?x=REDACTED")
    # an earlier ptestore redacted the user information of every protocol: a recorded
    # abfs://REDACTED@ACCOUNT names no container, never re-opened
    assert is_redacted("abfs://REDACTED@acct.dfs.core.windows.net/m.pte")
    assert is_redacted("memory://REDACTED@h/m.pte")
    assert not is_redacted("abfs://prod@acct.dfs.core.windows.net/REDACTED.pte")


def _memory_url(fs: Any, name: str, data: bytes) -> str:
    url = f"memory://secrets2/{name}?token=TOKENsecret3"  # the query is the object's name here
    fs.pipe(url, data)
    return url


def test_a_source_given_as_its_destination_is_compared_by_the_url_read() -> None:
    """The loader's name is redacted: compared with the writer's URL it named another
    object, and an unchanged in-place run rewrote the file (5408 -> 6249 bytes)."""
    import fsspec

    import ptestore

    fs = fsspec.filesystem("memory")
    data = get_fixture("mlp_portable").pte_path.read_bytes()  # type: ignore[union-attr]
    url = _memory_url(fs, "m.pte", data)
    loader = open_loader(url)
    assert loader.name == "memory://secrets2/m.pte?token=REDACTED"
    assert loader_url(loader) == url
    loader.close()
    report = ptestore.specialize(url, url, backends=["passthrough"], allow_unchanged=True)
    assert [f.status for f in report.files] == ["unchanged"]
    assert fs.cat(url) == data


def test_an_in_place_pair_through_loaders_is_refused_and_shown_redacted() -> None:
    import fsspec

    from ptestore.coordinator.pipeline import initialize_and_save_backend_data
    from ptestore.errors import ConfigurationError
    from ptestore.writers import open_writer

    fs = fsspec.filesystem("memory")
    fx = get_fixture("mlp_portable_ext")
    assert fx.pte_path is not None and fx.ptd_path is not None
    pte = _memory_url(fs, "p.pte", fx.pte_path.read_bytes())
    ptd = _memory_url(fs, "p.ptd", fx.ptd_path.read_bytes())
    before = fs.cat(ptd)
    with pytest.raises(ConfigurationError) as caught:
        initialize_and_save_backend_data(
            open_loader(pte),
            open_writer("memory://secrets2/out.pte"),
            ptd_loader=open_loader(ptd),
            ptd_writer=open_writer(ptd),
            backends=["passthrough"],
        )
    shown = redacted_url(ptd)
    assert str(caught.value) == (
        f"in-place specialization of a .pte/.ptd pair is refused ({shown} -> {shown}): the "
        "two files cannot be published in one atomic step; write the pair to new names"
    )
    assert fs.cat(ptd) == before and not fs.exists("memory://secrets2/out.pte")
