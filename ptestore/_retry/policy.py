"""The one retry policy of ptestore's storage calls (tenacity).

tenacity is imported by the first :meth:`RetryPolicy.call`, not with this module: the
loaders and writers of local files import the policy's names and never call it, and
tenacity (with tornado when that is installed) costs tens of milliseconds of start-up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .._dataclass import dataclass
from .._log import get_logger
from ..errors import ConfigurationError
from ..storage.types import redact_urls, redacted_url
from .categories import find_error_info, is_transient, shown

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = ["CONFLICT_RETRY", "DEFAULT_RETRY", "RETRY_OPTIONS", "RetryPolicy"]

log = get_logger("ptestore.retry")
T = TypeVar("T")

#: Storage options that configure :class:`RetryPolicy` (accepted by every remote
#: loader and writer).
RETRY_OPTIONS = ("retry_attempts", "retry_initial", "retry_max")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry transient failures (:func:`is_transient`) with jittered exponential backoff.

    Retried: 5xx answers, 408/429, throttling codes (``SlowDown``, ``Throttling``...),
    connection resets and timeouts, over S3 and http(s) alike. Never retried: missing
    objects, permission problems, failed preconditions, other 4xx answers, anything of
    ptestore's own. An answer's ``Retry-After`` lengthens the wait before the next
    attempt to what it asks, never beyond :attr:`maximum` (:meth:`wait_for`).

    A read-modify-write retries its conflicts instead (``retry_on=is_conflict``, with
    :data:`CONFLICT_RETRY`): each attempt reads again, so a lost race is worth redoing.
    """

    #: Attempts in total, the first one included.
    attempts: int = 6
    #: Seconds before the first retry (doubling each time, plus up to this much jitter).
    initial: float = 0.1
    #: Upper bound of one wait, in seconds.
    maximum: float = 5.0

    def __post_init__(self) -> None:
        _check_number("retry_attempts", self.attempts, int, 1)
        _check_number("retry_initial", self.initial, float, 0)
        _check_number("retry_max", self.maximum, float, 0)

    @classmethod
    def from_options(cls, url: str, options: dict[str, Any]) -> RetryPolicy:
        """Take ``retry_attempts``/``retry_initial``/``retry_max`` out of ``options``."""
        given = {name: options.pop(name) for name in RETRY_OPTIONS if name in options}
        try:
            return cls(
                attempts=given.get("retry_attempts", cls.attempts),
                initial=given.get("retry_initial", cls.initial),
                maximum=given.get("retry_max", cls.maximum),
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{redacted_url(url)}: {exc}") from None

    def wait_for(self, exc: BaseException | None, backoff: float) -> float:
        """Seconds to wait after the failure ``exc``: ``backoff`` (the jittered
        exponential one), or longer when the answer's ``Retry-After`` asks for more,
        never more than :attr:`maximum` for it (a server asking for an hour, or for a
        date far ahead, waits ``retry_max``)."""
        info = find_error_info(exc) if exc is not None else None
        asked = info.retry_after if info is not None else None
        if asked is None:
            return backoff
        return max(backoff, min(asked, self.maximum))

    def call(
        self,
        fn: Callable[[], T],
        *,
        what: str = "storage call",
        on_retry: Callable[[], None] | None = None,
        retry_on: Callable[[BaseException], bool] = is_transient,
        level: int = logging.WARNING,
        reason: Callable[[BaseException], str] | None = None,
    ) -> T:
        """Run ``fn``; retry the failures ``retry_on`` accepts (default: transient
        ones); re-raise the last failure as it is.

        ``what`` names the call in the retry log (at ``level``: a caller that reports
        its retries itself logs them at DEBUG) and ``reason`` says there in words why an
        attempt failed (default: the service's error, else the exception's class and
        message; a caller whose own exception marks an attempt to make again gives its
        sentence); ``on_retry`` runs before each retry.
        """
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
            wait_random,
        )

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            said = shown(exc) if exc is not None else None
            info = find_error_info(said) if said is not None else None
            if reason is not None and exc is not None:
                why = reason(exc)
            else:
                why = info.describe() if info is not None else f"{type(said).__name__}: {said}"
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.log(
                level,
                "%s: attempt %d of %d failed (%s); retrying in %.2fs",
                redact_urls(what),
                state.attempt_number,
                self.attempts,
                redact_urls(why),
                wait,
            )
            if on_retry is not None:
                on_retry()

        backoff = wait_exponential(multiplier=self.initial, max=self.maximum) + wait_random(
            0, self.initial
        )

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            return self.wait_for(exc, backoff(state))

        retrying = Retrying(
            retry=retry_if_exception(retry_on),
            stop=stop_after_attempt(self.attempts),
            wait=wait,
            reraise=True,
            before_sleep=before_sleep,
        )
        return retrying(fn)


def _check_number(name: str, value: object, kind: type, minimum: float) -> None:
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if ok and not math.isfinite(value):  # type: ignore[arg-type]
        raise ConfigurationError(f"{name} = {value!r}: must be a finite number")
    if not ok or value < minimum:  # type: ignore[operator]
        what = "an int" if kind is int else "a number"
        raise ConfigurationError(f"{name} = {value!r}: must be {what} >= {minimum:g}")


#: The policy used when no retry option is given.
DEFAULT_RETRY = RetryPolicy()
#: The policy of read-modify-write loops over ``publish(mode="if-match")`` (with
#: ``retry_on=is_conflict``): many quick attempts, since a conflict means another
#: writer just succeeded, and each attempt does the whole read, merge and publish.
CONFLICT_RETRY = RetryPolicy(attempts=20, initial=0.01, maximum=0.5)
