"""The storage types every layer shares: what a loader is, what a buffer is, how a URL splits.

This module imports only the standard library (and, to refuse a name, ptestore's errors
and how a value is shown, both standard library only themselves), so ``format/``,
``writers/``, ``provenance/`` and the coordinator take their types from here, never from
an implementation module (:mod:`ptestore.storage.loaders` imports fsspec).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = [
    "LOCAL_SCHEMES",
    "REDACTED",
    "Buffer",
    "DataLoader",
    "StorageURL",
    "URLLike",
    "absolute_local",
    "absolute_path",
    "file_path",
    "is_redacted",
    "is_relative_local",
    "load_into",
    "loader_url",
    "local_path",
    "redact_urls",
    "redacted_url",
    "split_url",
    "strerror",
    "url_identity",
    "url_origin",
]

#: Bytes as ptestore takes them: anything read by a loader or handed to a writer.
Buffer = bytes | bytearray | memoryview


@runtime_checkable
class DataLoader(Protocol):
    """Read-only, random-access view of one stored object."""

    #: The path or URL the bytes come from, as it is shown (:func:`redacted_url`: the
    #: credentials a remote URL carries replaced by :data:`REDACTED`); used in every
    #: error message and recorded by provenance, never opened again, never compared
    #: (two URLs with their credentials redacted may name two objects: a loader's
    #: identity is :func:`loader_url`'s).
    name: str

    def size(self) -> int:
        """Total size of the object in bytes."""
        ...

    def load(self, offset: int, size: int) -> Buffer:
        """Return exactly ``size`` bytes starting at ``offset``.

        Raises :class:`~ptestore.errors.StorageError` if the range is outside the object.
        """
        ...

    def check_unchanged(self) -> None:
        """Raise :class:`~ptestore.errors.StorageError` (ptestore's loaders: its subclass
        :class:`~ptestore.errors.PreconditionFailed`) if the object was modified or
        replaced since the loader was opened (its bytes may then be a mix of two
        versions). Called before publishing anything derived from it."""
        ...

    def close(self) -> None:
        """Release any resources; idempotent."""
        ...


def load_into(loader: DataLoader, offset: int, buffer: memoryview) -> None:
    """Fill all of ``buffer`` (writable, bytes) with ``loader``'s bytes at ``offset``:
    straight into it where the loader reads into memory it is given (``readinto``: local
    files, by ``preadv``), else one :meth:`~DataLoader.load` copied in."""
    readinto = getattr(loader, "readinto", None)
    if readinto is not None:
        readinto(offset, buffer)
        return
    buffer[:] = memoryview(loader.load(offset, buffer.nbytes)).cast("B")


#: An RFC 3986 scheme followed by ``://``: what makes a string a URL rather than a path
#: (``dir/a://b`` is a path: ``dir/a`` is not a scheme).
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")

#: Schemes that name a local file (case-insensitive, as every scheme): fsspec registers
#: ``local`` as an alias of ``file``.
LOCAL_SCHEMES = frozenset({"file", "local"})
#: Schemes that are one protocol under another name.
_ALIASES = {"local": "file", "s3a": "s3"}


def absolute_path(path: str) -> str:
    """``path`` made absolute against the current directory WITHOUT normalizing it: a
    ``..`` stays for the kernel to resolve after the symbolic link before it
    (``lnk/../m.pte`` with ``lnk -> real/sub`` is ``real/m.pte``, where
    ``os.path.abspath`` would say ``m.pte``), and so does a trailing ``/``."""
    if not path:  # file:// alone: the current directory
        return os.getcwd()
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(protocol, path)``: THE classification of a path or URL (see
    :class:`StorageURL`, which holds its result).

    - A plain path, and ``file://`` / ``local://`` in any letter case, give
      ``("file", absolute path)`` (:func:`absolute_path`: not normalized, the file
      system resolves ``.``, ``..`` and symbolic links); what follows ``file://`` is a
      local path, so ``file:///abs/m.pte`` is ``/abs/m.pte`` and ``file://rel/m.pte`` is
      ``rel/m.pte`` under the current directory, as for a plain path (and as fsspec
      reads it).
    - ``s3://`` and ``s3a://`` give ``("s3", "bucket/key")``; ``memory://x`` gives
      ``("memory", "/x")``; any other scheme gives ``(scheme, url)`` (lower-cased
      scheme, the URL as given).
    """
    text = os.fspath(url)
    match = _SCHEME.match(text)
    if match is None:
        return "file", absolute_path(text)
    scheme = match.group(1).lower()
    protocol = _ALIASES.get(scheme, scheme)
    rest = text[match.end() :]
    if protocol == "file":
        return "file", absolute_path(rest)
    if protocol == "s3":
        return "s3", rest
    if protocol == "memory":
        return "memory", "/" + rest.lstrip("/")
    return protocol, text


#: The port a URL without one means.
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def url_origin(url: str) -> tuple[str, str, str]:
    """``(protocol, host, port)`` of a URL naming its server (``https://user@Host/x``
    -> ``("https", "host", "443")``): the user information left out, the host in lower
    case without a final dot, the protocol's default port where none is given."""
    protocol, rest = url.split("://", 1) if "://" in url else ("", url)
    protocol = protocol.lower()
    authority = rest
    for end in "/?#":
        authority = authority.partition(end)[0]
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):  # an IPv6 address: [::1]:8080
        host, _, after = authority[1:].partition("]")
        port = after[1:] if after.startswith(":") else ""
    else:
        host, _, port = authority.partition(":")
    return protocol, host.lower().rstrip("."), port or _DEFAULT_PORTS.get(protocol, "")


class StorageURL(NamedTuple):
    """A path or URL split once (by :func:`split_url`): what it was given as, its
    protocol and its path. ``open_loader``, ``open_writer`` and the option routing
    (:mod:`ptestore.storage.routing`) take one in place of a string, so a URL is split
    once however many of them look at it. Every "is this local, and where?" question in
    ptestore is asked of one (:attr:`local`, :attr:`path`, :attr:`location`)."""

    #: The path or URL as given (``os.fspath``).
    text: str
    #: ``"file"`` for plain paths, ``file://`` and ``local://``; ``"s3"`` for ``s3a://``
    #: too; else the scheme, lower-cased.
    protocol: str
    #: As :func:`split_url` returns it (absolute for local files).
    path: str

    @classmethod
    def of(cls, url: str | os.PathLike[str] | StorageURL) -> StorageURL:
        """``url`` split (a :class:`StorageURL` is returned as it is). A NUL byte in it is
        a :class:`~ptestore.errors.ConfigurationError` naming the value (escaped), before
        anything opens it (the OS would raise a bare ``ValueError``)."""
        if isinstance(url, StorageURL):
            return url
        text = os.fspath(url)
        if "\x00" in text:  # the kernel takes none, a store's key neither: refused here
            from .._text import shown
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"{shown(text)}: contains a NUL byte ('\\x00', at character "
                f"{text.index(chr(0))}): no path or URL can hold one"
            )
        return cls(text, *split_url(text))

    @property
    def local(self) -> bool:
        """A local file (plain path, ``file://`` or ``local://``): it takes no storage
        options."""
        return self.protocol == "file"

    @property
    def location(self) -> str:
        """Where the object is, one spelling per object for keys and records: a local
        file's real path (symbolic links resolved), else the URL as given."""
        return os.path.realpath(self.path) if self.local else self.text


def local_path(url: str | os.PathLike[str] | StorageURL) -> str | None:
    """The absolute path of a local ``url`` (plain path, ``file://``, ``local://``), or
    None for a URL of any other scheme."""
    u = StorageURL.of(url)
    return u.path if u.local else None


def file_path(url: str | os.PathLike[str] | StorageURL) -> str | None:
    """The path the OS is given for a local ``url``: a plain path as it is given (a
    relative one stays relative, resolved against the current directory as
    :func:`split_url` resolves it), the path a ``file://`` or ``local://`` URL names
    (:attr:`StorageURL.path`); None for a URL of any other scheme. What code that opens,
    makes or renames local files itself (not through a loader or a writer) takes."""
    u = StorageURL.of(url)
    if not u.local:
        return None
    return u.text if _SCHEME.match(u.text) is None else u.path


def is_relative_local(url: str | os.PathLike[str]) -> bool:
    """A local path or ``file://``/``local://`` URL that is relative (to the current
    directory of whoever reads it)."""
    text = os.fspath(url)
    match = _SCHEME.match(text)
    if match is None:
        return not os.path.isabs(text)
    if _ALIASES.get(match.group(1).lower(), match.group(1).lower()) != "file":
        return False
    return not os.path.isabs(text[match.end() :])


def absolute_local(url: str | os.PathLike[str]) -> str:
    """``url`` with a relative local path made absolute (against the current
    directory); any other URL as given."""
    text = os.fspath(url)
    return split_url(text)[1] if is_relative_local(text) else text


#: What ``open_loader``, ``open_writer`` and the option routing take as a URL.
URLLike = str | os.PathLike[str] | StorageURL


def strerror(exc: OSError) -> str:
    """The system's text for an ``OSError`` (its ``strerror``, else its ``str``)."""
    return exc.strerror or str(exc)


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
    match = _SCHEME.match(url)
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
    if "://" not in url:
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
    if "://" not in url:
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
    if REDACTED not in url or "://" not in url:
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


def loader_url(loader: DataLoader) -> str:
    """The URL or path ``loader`` reads, credentials included (a remote loader's
    ``url``; a wrapper's ``inner`` loader's; else its ``name``): what a loader is
    compared by (is a destination its source?) and, through :func:`url_identity`, keyed
    by, where its ``name`` (redacted) would make two objects one. Never shown."""
    seen = 0
    while seen < 16:  # wrappers of wrappers, never a cycle
        url = getattr(loader, "url", None)
        if isinstance(url, str):
            return url
        inner = getattr(loader, "inner", None)
        if inner is None or not hasattr(inner, "load"):
            break
        loader, seen = inner, seen + 1
    return loader.name


def _redact_match(match: re.Match[str]) -> str:
    text = match.group(0)
    stripped = text.rstrip(".,:;!")
    return redacted_url(stripped) + text[len(stripped) :]


def redact_urls(text: str) -> str:
    """``text`` (a message: ptestore's, or a library's it passes on) with every URL in
    it as :func:`redacted_url` shows it; the rest as it is."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_redact_match, text)
