"""``redact_urls`` on a message whose URLs hold quotes and brackets: RFC 3986 allows
``'()*`` (and people put ``[]``) unencoded in user information, and a credential
parameter's value may hold them too, while the text around a URL quotes or brackets
it. The password or signature never survives; a URL without credentials is unchanged.
Property-based (hypothesis), with the reported cases pinned."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ptestore import _redact
from ptestore.errors import (
    BackendError,
    MissingNamedData,
    ObjectNotFound,
    PteStoreError,
    StorageError,
)
from ptestore.storage.types import REDACTED, redact_urls

#: What user information may hold unencoded (unreserved, sub-delims, ``:``, ``%``), and
#: the brackets people put there.
USERINFO_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:%[]"
#: What a query value may hold unencoded (no ``&`` nor ``#``), and brackets.
QUERY_CHARS = string.ascii_letters + string.digits + "-._~!$'()*+,;=:@/?%[]"
#: What the text around a URL puts before and after it.
BEFORE = ["", "failed: ", "'", '"', "(", "[", "{", "<", "url=URL('", "see ("]
AFTER = ["", "'", '"', ")", "]", "}", ">", "')", "'); next", ".", ": read failed", "', 'x'"]
SECRET_NAMES = ["X-Amz-Signature", "X-Amz-Credential", "sig", "token", "Signature", "api_key"]
#: Where the user information is a credential (the others name the object).
SCHEMES = ["http", "https", "s3", "ftp", "sftp", "gist", "webhdfs", "unknown+proto"]

_SETTINGS = settings(max_examples=150, deadline=None)


def _secret(chars: str) -> st.SearchStrategy[str]:
    # with a letter or digit in it: one made of quotes and stops alone is the text's
    return st.text(st.sampled_from(chars), min_size=1, max_size=24).map(lambda s: f"{s}Q7{s}")


def _survives(secret: str, out: str) -> bool:
    return secret in out.replace(REDACTED, "\0")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("failed: https://alice:pa(ss@host/x.pte", "failed: https://REDACTED@host/x.pte"),
        ("failed: https://alice:p'ss@host/x.pte", "failed: https://REDACTED@host/x.pte"),
        ("(https://alice:p)ss@host/x.pte)", "(https://REDACTED@host/x.pte)"),
        ("'https://alice:p[1]ss@host/x.pte'", "'https://REDACTED@host/x.pte'"),
        ("'https://h/x.pte?X-Amz-Signature=ab'cd'", "'https://h/x.pte?X-Amz-Signature=REDACTED'"),
        ("(https://h/x?sig=a(b)&v=1)", "(https://h/x?sig=REDACTED&v=1)"),
        # the user information that names the object, and a local path, kept
        ("'abfs://con(tainer@acct.dfs.core.windows.net/m.pte'", None),
        ("(github://org:re'po@main/m.pte)", None),
        ("see file:///tmp/a?token=kept, and /tmp/b?token=kept", None),
        # another URL after a local one is redacted
        ("'file:///a','https://u:p(w@h/m.pte'", "'file:///a','https://REDACTED@h/m.pte'"),
    ],
)
def test_quotes_and_brackets_inside_a_credential(text: str, shown: str | None) -> None:
    assert redact_urls(text) == (text if shown is None else shown)
    assert redact_urls(redact_urls(text)) == redact_urls(text)


@_SETTINGS
@given(
    before=st.sampled_from(BEFORE),
    after=st.sampled_from(AFTER),
    scheme=st.sampled_from(SCHEMES),
    user=st.text(st.sampled_from(string.ascii_letters), max_size=8),
    password=_secret(USERINFO_CHARS),
)
def test_a_password_never_survives(
    before: str, after: str, scheme: str, user: str, password: str
) -> None:
    text = f"{before}{scheme}://{user}:{password}@host.example:8080/models/m.pte{after}"
    out = redact_urls(text)
    assert not _survives(password, out), out
    assert f"{scheme}://{REDACTED}@host.example:8080/models/m.pte" in out
    assert redact_urls(out) == out


@_SETTINGS
@given(
    before=st.sampled_from(BEFORE),
    after=st.sampled_from(AFTER),
    name=st.sampled_from(SECRET_NAMES),
    signature=_secret(QUERY_CHARS),
    last=st.booleans(),
)
def test_a_signature_never_survives(
    before: str, after: str, name: str, signature: str, last: bool
) -> None:
    query = f"versionId=3&{name}={signature}" + ("" if last else "&x-id=GetObject")
    text = f"{before}https://bucket.s3.amazonaws.com/m.pte?{query}{after}"
    out = redact_urls(text)
    assert not _survives(signature, out), out
    assert out.startswith(f"{before}https://bucket.s3.amazonaws.com/m.pte?versionId=3&{name}=")
    assert redact_urls(out) == out


@_SETTINGS
@given(
    before=st.sampled_from(BEFORE),
    after=st.sampled_from(AFTER),
    scheme=st.sampled_from(SCHEMES),
    path=st.text(st.sampled_from(QUERY_CHARS.replace("?", "")), max_size=20),
    params=st.lists(
        st.tuples(
            st.sampled_from(["versionId", "x-id", "partNumber", "v", "name"]),
            st.text(st.sampled_from(QUERY_CHARS), max_size=12),
        ),
        max_size=3,
    ),
)
def test_a_url_without_credentials_is_unchanged(
    before: str, after: str, scheme: str, path: str, params: list[tuple[str, str]]
) -> None:
    query = "&".join(f"{n}={v}" for n, v in params)
    url = f"{scheme}://host.example/{path}{'?' + query if query else ''}"
    assume("://" not in url[len(scheme) + 3 :])  # a URL inside it: another test's
    text = f"{before}{url}{after}"
    assert redact_urls(text) == text


@pytest.mark.parametrize(
    "exc",
    [
        StorageError("https://alice:PASSWORD@h/m.pte?X-Amz-Signature=SIG: read failed"),
        # both quotes in the message: repr escapes one; redacted before it is quoted
        ObjectNotFound("\"x\" https://alice:p'ss@h/m.pte?sig=a'b 'y': no such object"),
        MissingNamedData("https://bob:PASSWORD@h/m.pte: no key", key="k"),
        BackendError("failed on https://h/m.pte?token=SIG", backend="xnn"),
    ],
    ids=["storage", "quotes", "missing", "backend"],
)
def test_an_errors_repr_shows_no_credential_and_its_args_stay(exc: PteStoreError) -> None:
    shown = repr(exc)
    for secret in ("PASSWORD", "SIG", "p'ss", "p\\'ss", "a'b", "a\\'b"):
        assert secret not in shown
    assert shown.startswith(f"{type(exc).__name__}(") and REDACTED in shown
    assert shown == f"{type(exc).__name__}({', '.join(repr(redact_urls(a)) for a in exc.args)})"
    assert "PASSWORD" in exc.args[0] or "SIG" in exc.args[0] or "p'ss" in exc.args[0]
    # what Dask's ``error_message`` and a worker's ``%r`` log
    assert "PASSWORD" not in f"{exc!r}" and "PASSWORD" not in repr([exc])


_PATTERNS = [_redact._USERINFO_IN_TEXT, _redact._URL_RUN, _redact._URL_IN_TEXT]


@settings(max_examples=600, deadline=None)
@given(
    text=st.lists(
        st.tuples(
            st.text(alphabet=" '(/:@?=&", max_size=3),  # text before a run
            st.text(alphabet="aZ0-+.", max_size=5),  # a scheme-like run, or none
            st.sampled_from(["://", "://u:p@h", "://h/?sig=x&", "://'", ":", ""]),
        ).map("".join),
        max_size=4,
    ).map("".join),
    which=st.sampled_from(range(len(_PATTERNS))),
)
def test_urls_are_found_where_re_finds_them(text: str, which: int) -> None:
    """``_sub_urls`` tries each pattern only at the first letter of the scheme-like run
    before each ``://`` (re tried every position: quadratic in a long run of letters
    and digits, a 40,000-character hex dump took 6.5 s); it finds what ``re.sub`` finds."""
    pattern = _PATTERNS[which]

    def mark(m: re.Match[str]) -> str:
        return f"<{m.group(0)}>"

    assert _redact._sub_urls(pattern, mark, text) == pattern.sub(mark, text)


def test_urls_after_many_local_ones_are_found_without_recursing() -> None:
    """Each local URL's run was searched for the next URL by a recursive call: a thousand
    of them in a row were a RecursionError, hiding the message it was redacting."""
    many = "file:///x/" * 3000
    assert redact_urls(f"{many}https://u:PASSWORD@h/m.pte") == f"{many}https://{REDACTED}@h/m.pte"
    assert redact_urls("file:///a/file:///b/s3://k:s@b/x?X-Amz-Signature=z") == (
        f"file:///a/file:///b/s3://{REDACTED}@b/x?X-Amz-Signature={REDACTED}"
    )
