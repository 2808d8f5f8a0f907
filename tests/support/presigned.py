"""An HTTP store on 127.0.0.1 reached as a presigned store is: by URLs that carry
credentials (a user and password, an S3 SigV4 presigned query). It serves the objects of
:mod:`support.http_store` (``HEAD``, ``GET`` whole or one ``Range``) by their path, the
query ignored, and refuses a request without the credentials it issued: 401 without the
user and password (``Authorization: Basic``), 403 without one of its signatures as
``X-Amz-Signature``. So a URL ptestore re-opened from what it shows or records (where
the credentials are ``REDACTED``) fails, and every request that succeeds carried them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from support.faulty_proxy import local_http_server
from support.http_store import StoreState
from support.http_store import _handler as store_handler

USER = "alice"
PASSWORD = "PASSWORDsecret1"
#: What a presigned query carries besides its signature (the credential and the session
#: token are credentials too: redacted, never keyed).
CREDENTIAL = "AKIASECRETKEYID%2F20250101%2Fus-east-1%2Fs3%2Faws4_request"
TOKEN = "TOKENsecret2"
#: The signatures the store issued (one per "rotation").
SIGNATURES = ("SIGNATUREsecretA", "SIGNATUREsecretB")
#: Every secret a URL of this store carries: none may be shown or recorded.
SECRETS = (USER + ":", PASSWORD, "AKIASECRETKEYID", TOKEN, *SIGNATURES)


@dataclass
class PresignedStore:
    base: str
    state: StoreState
    #: ``(raw request path, Authorization header)`` of every request, in order.
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def url(self, path: str, signature: str = SIGNATURES[0], *, user: bool = True) -> str:
        """A presigned URL of ``path`` (``/m.pte``) with ``signature``, the user and
        password in it unless ``user`` is False, and a ``versionId`` (kept when shown)."""
        host = self.base.removeprefix("http://")
        auth = f"{USER}:{PASSWORD}@" if user else ""
        return (
            f"http://{auth}{host}{path}?versionId=v7&X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential={CREDENTIAL}&X-Amz-Date=20250101T000000Z&X-Amz-Expires=900"
            f"&X-Amz-SignedHeaders=host&X-Amz-Security-Token={TOKEN}"
            f"&X-Amz-Signature={signature}"
        )


def _expected_auth() -> str:
    return "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@contextmanager
def presigned_store(
    objects: dict[str, bytes], *, user: bool = True, hide: bool = False
) -> Iterator[PresignedStore]:
    """Serve ``objects`` (by path); ``user``: refuse requests without the user and
    password (401). Every request must carry one of :data:`SIGNATURES` (403).
    ``hide``: answer a request without them 404 instead, as a private store does (S3
    without ``s3:ListBucket``, GitHub's private repositories): no such object."""
    state = StoreState(dict(objects))
    seen: list[tuple[str, str | None]] = []
    base = store_handler(state)

    class Handler(base):  # type: ignore[misc, valid-type]
        def _answer(self, with_body: bool) -> None:
            auth = self.headers.get("Authorization")
            seen.append((self.path, auth))
            path, _, query = self.path.partition("?")
            signed = any(f"X-Amz-Signature={s}" in query.split("&") for s in SIGNATURES)
            refusal = None
            if user and auth != _expected_auth():
                refusal = 401
            elif not signed:
                refusal = 403
            if refusal is not None and hide:
                refusal = 404
            if refusal is not None:
                self.send_response(refusal)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.path = path  # the object by its path: the query is the request's
            super()._answer(with_body)

    with local_http_server(Handler) as url:
        yield PresignedStore(url, state, seen)
