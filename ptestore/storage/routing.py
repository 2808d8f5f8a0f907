"""Which storage option goes to which side: the one module that decides.

Each loader and writer class declares the options it accepts as data on the class
(``options`` and ``accepted_options(url)``: :class:`~ptestore.storage.loaders.LocalFileLoader`,
:class:`~ptestore.storage.loaders.FsspecLoader` and every
:class:`~ptestore.writers.DataWriter`); :func:`~ptestore.storage.loaders.loader_options`
and :func:`~ptestore.writers.writer_options` return those *names* for a URL (both ask the
scheme table, :mod:`ptestore.storage.schemes`, which imports a writer class by name, on
first use: storage sits below the writers and never imports them). This module
routes one set of options, given for a whole run, to the loaders and writers of that run:

- **common** options reach every remote URL whose loader or writer accepts them: a
  writer-only option such as ``part_size`` reaches writers, not loaders; the
  ``retry_*`` options, which both take, reach both. Local paths get none of them.
- **side** options (``src``: the sources; ``dst``: the destinations, as read and as
  written) go to their side as given, over the common ones, local files included, and
  are checked there (a local destination takes its writer's ``durable`` and
  ``auto_mkdir``); those only a destination's writer takes are not given to its reads.
- A common option that no loader and no writer of any URL of the run accepts is refused
  (:meth:`StorageOptions.check`), before anything is opened.

The front end (:func:`ptestore.specialize`), the pair runner
(:func:`ptestore.coordinator.specialize_pair`), the fleet and :func:`ptestore.verify` all
route through here, so one option dict means the same thing to each of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..errors import ConfigurationError
from .schemes import loader_options, writer_options
from .types import StorageURL, URLLike, redacted_url

__all__ = ["StorageOptions", "options_for_loader", "options_for_writer"]


class StorageOptions:
    """The storage options of one run: ``common`` ones and each side's own (see the
    module docstring), made once per run; :meth:`for_loader` and :meth:`for_writer`
    return fresh dicts."""

    def __init__(
        self,
        common: Mapping[str, Any] | None = None,
        *,
        src: Mapping[str, Any] | None = None,
        dst: Mapping[str, Any] | None = None,
    ) -> None:
        self.common = dict(common or {})
        self.src = dict(src or {})
        self.dst = dict(dst or {})
        self._checked: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def check(
        self,
        sources: Iterable[URLLike],
        destinations: Iterable[URLLike] = (),
        *,
        local_ok: bool = False,
    ) -> None:
        """Refuse a common option that applies to no URL of the run: not to reading any
        source or destination, not to writing any destination. Local paths take none,
        so any common option given for a run on local paths only is refused too, unless
        ``local_ok`` (one pair of a fleet job: the job's options are for its remote
        pairs, and the job as a whole was checked)."""
        srcs = [StorageURL.of(u) for u in sources]
        dsts = [StorageURL.of(u) for u in destinations]
        run = (tuple(u.text for u in srcs), tuple(u.text for u in dsts))
        if run == self._checked:
            return  # the front end checks before its probes, the pair runner again
        remote = [u.text for u in (*srcs, *dsts) if not u.local]
        if not self.common:
            return
        if not remote:
            if local_ok:
                return
            urls = list(dict.fromkeys(redacted_url(u.text) for u in (*srcs, *dsts)))
            named = ", ".join(urls[:_URLS_NAMED]) + (
                f" and {len(urls) - _URLS_NAMED} more" if len(urls) > _URLS_NAMED else ""
            )
            raise ConfigurationError(
                f"storage options {sorted(self.common)} do not apply to local files "
                f"({named}): they are for remote URLs (s3://..., memory://...)"
            )
        accepted: set[str] = set()
        for u in (*srcs, *dsts):
            if not u.local:
                accepted |= loader_options(u)
        for u in dsts:
            if not u.local:
                accepted |= writer_options(u)
        unknown = sorted(set(self.common) - accepted)
        if unknown:
            raise ConfigurationError(_refusal(unknown, remote, accepted))
        self._checked = run

    def _pick(
        self, url: StorageURL, accepted: frozenset[str], own: dict[str, Any]
    ) -> dict[str, Any]:
        if url.local:
            return dict(own)  # local files take no common options; their own are checked
        return {**{k: v for k, v in self.common.items() if k in accepted}, **own}

    def for_loader(self, url: URLLike, side: Literal["src", "dst"] = "src") -> dict[str, Any]:
        """The options for reading ``url``, a source (``side="src"``) or a destination
        (``"dst"``: the create-mode probe, the fleet's provenance check, verify). A
        destination's own options that only its writer takes (a local writer's
        ``durable``, an S3 writer's ``part_size``) are the writer's: not given to the
        read (any other is, and refused there if the loader takes none such)."""
        u = StorageURL.of(url)
        own = self.src if side == "src" else self.dst
        accepted = frozenset() if u.local else loader_options(u)
        if side == "dst" and own:
            writer_only = writer_options(u) - accepted
            own = {k: v for k, v in own.items() if k not in writer_only}
        return self._pick(u, accepted, own)

    def for_writer(self, url: URLLike) -> dict[str, Any]:
        """The options for writing the destination ``url``."""
        u = StorageURL.of(url)
        return self._pick(u, frozenset() if u.local else writer_options(u), self.dst)


def options_for_loader(
    url: URLLike, options: Mapping[str, Any] | None, side: Literal["src", "dst"] = "src"
) -> dict[str, Any]:
    """The common ``options`` that apply to reading ``url`` (a filtered dict; the names
    a loader accepts are :func:`~ptestore.storage.loaders.loader_options`)."""
    return StorageOptions(options).for_loader(url, side)


def options_for_writer(url: URLLike, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The common ``options`` that apply to writing ``url`` (a filtered dict; the names
    a writer accepts are :func:`~ptestore.writers.writer_options`)."""
    return StorageOptions(options).for_writer(url)


#: How many of a run's remote URLs the refusal of an option names (a fleet has hundreds).
_URLS_NAMED = 3


def _refusal(unknown: list[str], remote: list[str], accepted: set[str]) -> str:
    """The message refusing common options ``unknown``: each named once, a few of the
    run's remote URLs, and the nearest accepted name of each (``difflib``) when there is
    one, else the accepted names."""
    import difflib  # only for the error

    urls = list(dict.fromkeys(redacted_url(u) for u in remote))
    where = ", ".join(urls[:_URLS_NAMED])
    if len(urls) > _URLS_NAMED:
        where += f" and {len(urls) - _URLS_NAMED} more URL(s) of the run"
    guesses = {
        name: found[0]
        for name in unknown
        if (found := difflib.get_close_matches(name, sorted(accepted), n=1, cutoff=0.6))
    }
    message = f"storage options {unknown} apply to none of {where}"
    if guesses:
        if len(unknown) == 1:
            hints = repr(guesses[unknown[0]])
        else:
            hints = ", ".join(f"{guess!r} for {name!r}" for name, guess in guesses.items())
        return f"{message} (did you mean {hints}?)"
    return f"{message} (accepted: {sorted(accepted)})"
