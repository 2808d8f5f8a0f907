"""Where a request for an ``http(s)://`` object may be redirected, and what goes with it
(docs/storage.md, "HTTP(S) and redirects").

fsspec's HTTP filesystem follows a server's redirects (3xx) by default, and aiohttp
drops only ``Authorization``, ``Cookie`` and ``Proxy-Authorization`` given as headers on
a redirect to another origin: every other header of the storage options
(``client_kwargs={"headers": ...}``, ``headers=``: an ``X-Api-Key``, a
``Private-Token``), and the cookies given (``client_kwargs={"cookies": ...}``, sent from
its jar on every hop), went to whatever host the server named. One aiohttp client
middleware on the filesystem's session (:class:`RedirectGuard`, installed by
:func:`guarded_options` when :func:`~.filesystems.open_filesystem` makes an HTTP
filesystem) sees every request the session sends, each hop of a redirect included,
before it is sent: the ``HEAD`` and ``GET`` of ``info``/``size``, every ranged ``GET``
of a read. Two rules:

- **A URL the caller gives** (``ptestore fetch https://api/x.pte``, a source of
  ``specialize``, an index's own URL): a request to another origin than the URL's is
  sent without the headers the storage options name (and without ``Authorization``,
  which a session's ``auth`` would otherwise add again): an API answering with a
  presigned object-store URL (GitHub's release assets) still works, and the object
  store never sees the API's token or key.
- **The objects an index read over http(s) names** (while :func:`index_redirects` is
  entered: ``fetch`` and ``ensure`` after the index was read): a request to an origin
  outside the index's own and the trusted ones (``trusted_origins=``, CLI
  ``--trust-origin``) is refused, a :class:`~ptestore.errors.StorageError` naming the
  redirect's target (redacted) and how to trust it, before anything is sent there; one
  within them keeps its headers (what trusting an origin means).

The guard is an option of the filesystem (fsspec's ``get_client``), with a repr made of
its rule alone, so fsspec's instance cache (keyed by the options' text) keeps one
filesystem per option set and rule, and it pickles (a filesystem sent to a worker).
aiohttp's client middlewares are 3.12's: an older aiohttp is a
:class:`~ptestore.errors.ConfigurationError` saying so. Nothing here imports aiohttp or
yarl but on the way to a request (start-up stays flat).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .._retry.categories import REDIRECT_REFUSED
from ..errors import ConfigurationError, StorageError
from .types import StorageURL, redacted_url

__all__ = [
    "DEFAULT_TIMEOUT",
    "GuardedClient",
    "RedirectGuard",
    "guarded_options",
    "index_redirects",
    "is_http_class",
    "refused_redirect",
]

#: The origins (index URL, trusted origins) the objects an index names may be
#: redirected within, while :func:`index_redirects` is entered; None: a URL given.
_SCOPE: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "ptestore_redirect_scope", default=None
)
#: Headers ptestore and fsspec set on each request themselves: never the caller's to strip.
_PROTOCOL_HEADERS = frozenset({"range", "accept-encoding"})
#: The attribute that marks the error of a refused redirect (:func:`refused_redirect`).
_MARK = REDIRECT_REFUSED
#: The aiohttp whose client sessions take middlewares.
_AIOHTTP_MIDDLEWARES = (3, 12)

Origin = tuple[str, str, int]


def is_http_class(cls: type) -> bool:
    """Whether ``cls`` is fsspec's HTTP filesystem (``http://``, ``https://``), or made
    from it (known by its class, without importing aiohttp)."""
    return any(
        c.__name__ == "HTTPFileSystem" and c.__module__ == "fsspec.implementations.http"
        for c in cls.__mro__
    )


@contextlib.contextmanager
def index_redirects(index: str, trusted: Sequence[str] | None) -> Iterator[None]:
    """Within: an HTTP filesystem made for the objects the index ``index`` names refuses
    a redirect to an origin other than the index's own and those ``trusted`` (the
    strings given as ``trusted_origins``, checked already). Nothing changes for an index
    that is not read over http(s) (this machine's, a store's: what they name gets the
    rule of a URL given)."""
    if StorageURL.of(index).protocol not in ("http", "https"):
        yield
        return
    token = _SCOPE.set((index, *(trusted or ())))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _origin(url: Any) -> Origin:
    """A yarl URL's origin as compared: the scheme, the host as sent (IDNA-encoded,
    lower case, no final dot) and the port (the scheme's default when none is given)."""
    host = (url.raw_host or "").lower().rstrip(".")
    return (url.scheme.lower(), host, int(url.port or 0))


def _origin_of(text: str) -> Origin:
    import yarl

    return _origin(yarl.URL(text))


def _shown(origin: Origin) -> str:
    scheme, host, port = origin
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


class RedirectGuard:
    """The aiohttp client middleware of an HTTP filesystem's session: a request to an
    origin outside ``allowed`` is refused (``refuse``) or sent without the headers
    named in ``strip`` (lower case). Compared and shown by its rule alone."""

    def __init__(self, allowed: Sequence[Origin], strip: Sequence[str], *, refuse: bool) -> None:
        self.allowed = tuple(sorted(set(allowed)))
        self.strip = tuple(sorted(set(strip)))
        self.refuse = refuse

    def _key(self) -> tuple[Any, ...]:
        return (self.allowed, self.strip, self.refuse)

    def __repr__(self) -> str:
        return f"RedirectGuard({self.allowed!r}, {self.strip!r}, refuse={self.refuse!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RedirectGuard) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    async def __call__(self, req: Any, handler: Any) -> Any:
        origin = _origin(req.url)
        if origin not in self.allowed:
            if self.refuse:
                raise _refusal(str(req.url), origin, self.allowed)
            for name in self.strip:
                req.headers.popall(name, None)
        return await handler(req)


def _refusal(target: str, origin: Origin, allowed: Sequence[Origin]) -> StorageError:
    shown = _shown(origin)
    within = ", ".join(_shown(o) for o in allowed)
    exc = StorageError(
        f"redirected to {redacted_url(target)}, of origin {shown}, not the index's own nor "
        f"a trusted one ({within}): refused, nothing was sent there (the storage options' "
        "headers go with every request of the objects an index read from a server names); "
        f"to allow it, trust that origin: trusted_origins=['{shown}'], CLI --trust-origin "
        f"{shown}"
    )
    setattr(exc, _MARK, redacted_url(target))
    return exc


def refused_redirect(exc: BaseException) -> StorageError | None:
    """The refusal of a redirect (:class:`RedirectGuard`) in ``exc``'s chain (fsspec's
    ``info`` raises ``FileNotFoundError`` from it), or None."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        if isinstance(current, StorageError) and hasattr(current, _MARK):
            return current
        seen.append(current)
        current = current.__cause__ or current.__context__
    return None


#: The timeouts of an HTTP session the storage options name none for (seconds):
#: aiohttp's own (a request 300, a connection 30), and 60 without a byte from the server
#: (aiohttp waits for none: a server that stalls held each attempt its 300 s, six
#: attempts half an hour).
DEFAULT_TIMEOUT = {"total": 300.0, "sock_connect": 30.0, "sock_read": 60.0}


class GuardedClient:
    """fsspec's ``get_client`` for an HTTP filesystem: the aiohttp session ``make``
    makes (the caller's ``get_client``; None: fsspec's, an ``aiohttp.ClientSession``)
    with ``guard`` as its last (innermost) middleware: it sees each request as sent."""

    def __init__(self, guard: RedirectGuard, make: Any = None) -> None:
        self.guard = guard
        self.make = make

    def __repr__(self) -> str:
        return f"GuardedClient({self.guard!r}, {self.make!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, GuardedClient)
            and self.guard == other.guard
            and self.make is other.make
        )

    def __hash__(self) -> int:
        return hash((self.guard, id(self.make)))

    async def __call__(self, **kwargs: Any) -> Any:
        import aiohttp

        kwargs["middlewares"] = (*(kwargs.get("middlewares") or ()), self.guard)
        if kwargs.get("timeout") is None:  # none given (client_kwargs={"timeout": ...})
            kwargs["timeout"] = aiohttp.ClientTimeout(**DEFAULT_TIMEOUT)
        if self.make is None:
            return aiohttp.ClientSession(**kwargs)
        session = await self.make(**kwargs)
        if self.guard not in tuple(getattr(session, "_middlewares", None) or ()):
            await session.close()
            raise ConfigurationError(
                f"storage option get_client={self.make!r}: the aiohttp session it made "
                "does not take the middlewares it was given (middlewares=): ptestore's "
                "guard of redirects must be among them; pass them on to aiohttp.ClientSession"
            )
        return session


def _header_names(value: object) -> list[str]:
    if isinstance(value, Mapping):
        return [str(k).lower() for k in value]
    try:
        return [str(k).lower() for k, _ in value]  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return []


def guarded_options(url: StorageURL, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` of an HTTP filesystem for ``url`` with its :class:`RedirectGuard`
    (the module docstring): the origin of ``url`` always allowed; within
    :func:`index_redirects` the index's and the trusted ones too, and any other refused;
    else a request to another origin sent without the headers the options give and
    ``Authorization``. :class:`ConfigurationError` for an aiohttp without client
    middlewares (before 3.12)."""
    import aiohttp

    version = tuple(int(p) for p in aiohttp.__version__.split(".")[:2] if p.isdigit())
    if version < _AIOHTTP_MIDDLEWARES:
        raise ConfigurationError(
            f"{redacted_url(url.text)}: reading http(s):// needs aiohttp 3.12 or later (its "
            "client middlewares keep the storage options' headers from the other hosts a "
            f"redirect names), found {aiohttp.__version__}: pip install 'aiohttp>=3.12'"
        )
    opts = dict(options)
    scope = _SCOPE.get()
    allowed = [_origin_of(url.text)]
    if scope is not None:
        allowed += [_origin_of(u) for u in scope]
    client = dict(opts.get("client_kwargs") or {})
    strip = {"authorization"}
    if client.get("cookies") or client.get("cookie_jar") is not None:
        # cookies given are the session jar's, domain-less: aiohttp sends them on every
        # hop of a redirect, to any host (it drops only a Cookie given as a header)
        strip.add("cookie")
    strip.update(_header_names(client.get("headers") or {}))
    strip.update(_header_names(opts.get("headers") or {}))
    guard = RedirectGuard(allowed, sorted(strip - _PROTOCOL_HEADERS), refuse=scope is not None)
    if "middlewares" in opts:  # a request's own middlewares replace the session's
        opts["middlewares"] = (*(opts["middlewares"] or ()), guard)
    opts["get_client"] = GuardedClient(guard, opts.get("get_client"))
    return opts
