"""What a URL shows and what it names: its credentials redacted (:func:`redacted_url`,
:func:`redact_urls` for a message), left out (:func:`url_identity`), recognised
(:func:`is_redacted`).

The standard library only (and no ``urllib``), importing nothing of ptestore's: the
base floor's modules that show a message take it from here, :mod:`ptestore._log` (a
warning's arguments) and :mod:`ptestore.errors` (every error's ``str()``), which may
import no storage module; :mod:`ptestore.storage.types` re-exports every public name
(the storage layer's API) and takes :data:`SCHEME` and :data:`LOCAL_SCHEMES` from here,
so what is a URL and what is local is one rule for splitting and for showing.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

__all__ = [
    "LOCAL_SCHEMES",
    "REDACTED",
    "SCHEME",
    "is_redacted",
    "redact_urls",
    "redacted_repr",
    "redacted_url",
    "url_identity",
]

#: An RFC 3986 scheme followed by ``://``: what makes a string a URL rather than a path
#: (``dir/a://b`` is a path: ``dir/a`` is not a scheme).
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")

#: Schemes that name a local file (case-insensitive, as every scheme): fsspec registers
#: ``local`` as an alias of ``file``.
LOCAL_SCHEMES = frozenset({"file", "local"})


def _holds_url(text: str) -> bool:
    """Whether ``text`` may hold a URL (the fast path: a local path never does)."""
    return "://" in text


# --- what a URL shows and what it names --------------------------------------------
#
# A URL may carry credentials: a user and password (``http://alice:PASSWORD@host/m.pte``)
# or a presigned query (S3's ``X-Amz-Signature``, ``X-Amz-Credential`` and
# ``X-Amz-Security-Token``, GCS's ``X-Goog-Signature``, Azure's SAS ``sig``, ...). Those
# are for the request only: what ptestore shows or records of a URL (error messages,
# provenance trailers, reports, index entries, cache manifests) is
# :func:`redacted_url`'s form, and what it keys by (the device cache's entry) is
# :func:`url_identity`'s. Standard library only, and no ``urllib``: a local command
# pays for neither (a local path is returned at once).

#: What a credential in a shown URL is replaced with.
REDACTED = "REDACTED"

#: Query parameters (lower case, ``-`` as ``_``) whose value is a credential, by name:
#: SigV2's access key, GCS V2's account, Azure SAS's signature, passwords.
_SECRET_PARAMS = frozenset(
    {"awsaccesskeyid", "googleaccessid", "sig", "passwd", "pwd", "auth", "authorization"}
)
#: ... and by how their name ends: SigV4's ``X-Amz-Signature``, ``X-Amz-Credential``,
#: ``X-Amz-Security-Token``, SigV2's ``Signature``, GCS's ``X-Goog-Signature`` and
#: ``X-Goog-Credential``, ``token``, ``access_token``, ``api_key``, ``client_secret``...
_SECRET_ENDINGS = (
    "signature",
    "credential",
    "credentials",
    "token",
    "secret",
    "password",
    "api_key",
    "apikey",
    "access_key",
    "accesskey",
    "private_key",
)
#: What else a presigned URL's query holds that does not name the object (its date,
#: expiry, signed headers; Azure SAS's fields): left out of :func:`url_identity` when
#: the query holds a credential. ``x_amz_*`` and ``x_goog_*`` are left out always.
_PRESIGN_PARAMS = frozenset(
    {"expires", "x_id", "sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sip"}
    | {"skoid", "sktid", "skt", "ske", "sks", "skv", "sdd", "saoid", "suoid", "scid", "ses"}
    | {"rscc", "rscd", "rsce", "rscl", "rsct"}
)
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
#: A URL inside a message: a scheme, ``://`` and what follows up to a space, a quote or
#: a bracket (:func:`redact_urls`).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}]+")


#: Protocols whose URL's user information is part of what the URL names, not a
#: credential: adlfs's ``abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/path`` (the
#: container), fsspec's ``github://ORG:REPO@REF/path`` (the repository), a
#: ``memory://`` path. On every other protocol (``http(s)``, ``ftp``, ``sftp``,
#: ``webhdfs``, fsspec's ``gist://:TOKEN@id``, an unknown one) it is taken for a
#: credential: stripped and redacted.
_NAMING_USERINFO = frozenset({"abfs", "abfss", "az", "adl", "github", "memory"})


def _param_name(part: str) -> str:
    name = part.partition("=")[0]
    if "%" in name:
        name = _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), name)
    return name.strip().lower().replace("-", "_")


def _is_secret(name: str) -> bool:
    return name in _SECRET_PARAMS or name.endswith(_SECRET_ENDINGS)


def _split_remote(url: str) -> tuple[str, str, str, str, str, str] | None:
    """``(scheme and '://', userinfo, host and path, '?' or '', query, '#' and
    fragment)`` of a remote URL (the user information ends at the authority's last
    ``@``, the authority at the first ``/``, as RFC 3986 splits it; empty for the
    protocols whose user information names the object, :data:`_NAMING_USERINFO`), or
    None for a local path or ``file://`` URL."""
    match = SCHEME.match(url)
    if match is None or match.group(1).lower() in LOCAL_SCHEMES:
        return None
    head, rest = url[: match.end()], url[match.end() :]
    rest, hashmark, fragment = rest.partition("#")
    rest, mark, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if match.group(1).lower() not in _NAMING_USERINFO:
        userinfo, _, host = authority.rpartition("@")
    else:  # no credential there: the authority names the object (its comment)
        userinfo, host = "", authority
    return head, userinfo, host + slash + path, mark, query, hashmark + fragment


def redacted_url(url: str) -> str:
    """``url`` as ptestore shows and records it: its user information (``user:password@``)
    and the value of every query parameter that carries a credential (S3 SigV4's
    ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``; SigV2's
    ``Signature``, ``AWSAccessKeyId``; GCS's ``X-Goog-Signature``,
    ``X-Goog-Credential``; Azure SAS's ``sig``; any ``token``, ``access_token``,
    ``password``, ``api_key``, ``secret``; names compared in any case) replaced by
    :data:`REDACTED`. Every other part (scheme, host, path, ``versionId`` and the other
    parameters, in their order) as given; a local path or ``file://`` URL, and a URL
    with nothing to hide, returned as it is. Applied again it changes nothing."""
    if not _holds_url(url):
        return url
    parts = _split_remote(url)
    if parts is None:
        return url
    head, userinfo, rest, mark, query, fragment = parts
    if userinfo:
        head += REDACTED + "@"
    if query:
        query = "&".join(
            f"{p.partition('=')[0]}={REDACTED}" if "=" in p and _is_secret(_param_name(p)) else p
            for p in query.split("&")
        )
    out = f"{head}{rest}{mark}{query}{fragment}"
    return url if out == url else out


def url_identity(url: str) -> str:
    """What ``url`` names, for keys (the device cache's entry): :func:`redacted_url`'s
    object without its credentials at all: no user information, and none of the query
    parameters that sign or authorize a request (those :func:`redacted_url` redacts,
    every ``X-Amz-*`` and ``X-Goog-*``, and with a credential in the query SigV2's
    ``Expires``, ``x-id`` and Azure SAS's fields), so one object reached through
    rotated presigned URLs has one identity. Other parameters (``versionId``) stay, in
    their order. A local path or ``file://`` URL is returned as it is, and so is a URL
    of either form (``url_identity(redacted_url(u)) == url_identity(u)``)."""
    if not _holds_url(url):
        return url
    parts = _split_remote(url)
    if parts is None:
        return url
    head, _, rest, mark, query, fragment = parts
    if query:
        pairs = [(p, _param_name(p)) for p in query.split("&")]
        signed = any("=" in p and _is_secret(n) for p, n in pairs)
        query = "&".join(
            p
            for p, n in pairs
            if not (
                _is_secret(n)
                or n.startswith(("x_amz_", "x_goog_"))
                or (signed and n in _PRESIGN_PARAMS)
            )
        )
        mark = mark if query else ""
    out = f"{head}{rest}{mark}{query}{fragment}"
    return url if out == url else out


def is_redacted(url: str) -> bool:
    """Whether ``url`` holds :data:`REDACTED` where :func:`redacted_url` puts it (its
    user information, a credential parameter's value): a URL as ptestore recorded it,
    whose credentials are not recorded, so it cannot reach a private object again (a
    store may answer 404 to a request without them). A local path never is. A
    ``REDACTED@`` authority is, on every protocol (an earlier ptestore redacted the user
    information of all of them: ``abfs://REDACTED@ACCOUNT`` names no container)."""
    if REDACTED not in url or not _holds_url(url):
        return False
    parts = _split_remote(url)
    if parts is None:
        return False
    _, userinfo, rest, _, query, _ = parts
    if not userinfo and rest.partition("/")[0].startswith(REDACTED + "@"):
        return True  # (a protocol whose user information names the object)
    return userinfo == REDACTED or any(
        p.partition("=")[2] == REDACTED and _is_secret(_param_name(p)) for p in query.split("&")
    )


def _redact_match(match: re.Match[str]) -> str:
    text = match.group(0)
    stripped = text.rstrip(".,:;!")
    return redacted_url(stripped) + text[len(stripped) :]


# A URL in a message may hold what also ends a quoted word: RFC 3986 allows ``'()*``
# (and people put ``[]``) unencoded in user information, and a credential parameter's
# value may hold a quote or a bracket. :data:`_URL_IN_TEXT` ends a URL there, so two
# passes that do not come first: user information up to the authority's last ``@``
# (what may not stand unencoded in a URL ends it: a space, ``/?#"<>{}\^`|``), and
# every credential parameter's value up to the next ``&``, ``#`` or space (less, at the
# URL's end, the closing quotes, brackets and stops of the text around it).
_USERINFO_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#\s\"<>{}\\^`|]+)@")
_URL_RUN = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://(\S+)")
_PARAM_IN_RUN = re.compile(r"([?&])([^=&#?\s]+)=([^&#\s]*)")
_TEXT_AFTER = "'\")]}>.,:;!"


def _redact_userinfo(match: re.Match[str]) -> str:
    scheme = match.group(1).lower()
    if scheme in LOCAL_SCHEMES or scheme in _NAMING_USERINFO or match.group(2) == REDACTED:
        return match.group(0)
    return f"{match.group(1)}://{REDACTED}@"


def _redact_param(match: re.Match[str]) -> str:
    mark, name, value = match.groups()
    if not _is_secret(_param_name(name)):
        return match.group(0)
    # the text's closing quotes and stops follow the run's last value, not one before '&'
    kept = value.rstrip(_TEXT_AFTER) if match.end() == len(match.string) else value
    return f"{mark}{name}={REDACTED}{value[len(kept) :]}" if kept else match.group(0)


def _redact_run(match: re.Match[str]) -> str | tuple[str, int]:
    head, rest = match.group(0)[: match.start(2) - match.start()], match.group(2)
    if match.group(1).lower() in LOCAL_SCHEMES:  # a local path: another URL after it only
        return head, match.start(2)  # looked for from there on (not by recursing: a
        # thousand local URLs in a row were a RecursionError)
    return head + _PARAM_IN_RUN.sub(_redact_param, rest)


_LETTERS = frozenset(string.ascii_letters)
_SCHEME_CHARS = _LETTERS | frozenset(string.digits + "+.-")


def _sub_urls(
    pattern: re.Pattern[str], fn: Callable[[re.Match[str]], str | tuple[str, int]], text: str
) -> str:
    """``pattern.sub(fn, text)`` for a pattern that starts with a scheme and ``://``,
    tried only where such a match can start: at the first letter of the scheme-like run
    before each ``://``. Letting ``re`` try every position scanned each run of letters
    and digits to its end from each of its characters: quadratic (a 40,000-character
    hex dump in a server's message took 6.5 s to redact). ``fn`` may answer ``(text,
    end)``: ``text`` replaces the match's start up to ``end``, and the search goes on
    from ``end``, inside the match."""
    out: list[str] = []
    done = 0
    colon = text.find("://")
    while colon >= 0:
        start = colon
        while start > done and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < colon and text[start] not in _LETTERS:
            start += 1  # a scheme starts with a letter: re's leftmost match did too
        match = pattern.match(text, start) if start < colon else None
        if match is not None:
            said = fn(match)
            shown, end = (said, match.end()) if isinstance(said, str) else said
            out += (text[done:start], shown)
            done = end
        colon = text.find("://", max(colon + 3, done))
    out.append(text[done:])
    return "".join(out)


def redact_urls(text: str) -> str:
    """``text`` (a message: ptestore's, or a library's it passes on) with every URL in
    it as :func:`redacted_url` shows it; the rest as it is. User information and a
    credential parameter's value are redacted whole even where they hold quotes or
    brackets (a value up to the next ``&``, ``#`` or space: text glued to it after a
    quote may go with it; closing quotes, brackets and stops at its end are kept)."""
    if not _holds_url(text):
        return text
    text = _sub_urls(_USERINFO_IN_TEXT, _redact_userinfo, text)
    text = _sub_urls(_URL_RUN, _redact_run, text)
    return _sub_urls(_URL_IN_TEXT, _redact_match, text)


def redacted_repr(exc: BaseException) -> str:
    """``repr(exc)`` (what Dask and ``%r`` log) with every URL in its arguments as
    :func:`redact_urls` shows it: each string argument redacted before it is quoted (an
    escaped quote hides nothing); ``exc.args`` as they are."""
    shown = (repr(redact_urls(a)) if isinstance(a, str) else redact_urls(repr(a)) for a in exc.args)
    return f"{type(exc).__name__}({', '.join(shown)})"
