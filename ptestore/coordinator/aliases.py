"""Alias checks: a segment shared by several keys or delegates must be replaced
consistently for all of them (or not at all)."""

from __future__ import annotations

from ..errors import InvalidReplacement
from .session import Run

__all__ = ["check_aliases"]


def check_aliases(run: Run) -> None:
    """Raise :class:`InvalidReplacement` for a shared segment replaced for some of its
    users only, or with different bytes for different users."""
    for (role, index), reps in sorted(run.replacements.items()):
        c = run.file(role).container
        users: list[str] = []
        for e in c.named_data:
            if e.segment_index != index:
                continue
            where = run.named.where(e.key) if e.key in run.named else None
            if where is not None and where[0].role != role:
                continue  # shadowed by the .ptd: not what the runtime reads
            users.append(f"key {e.key!r}")
        delegate_users = [
            f"delegate {d.method}[{d.position}]"
            for d in c.delegates
            if role == "pte" and d.location == "segment" and d.index == index
        ]
        users += delegate_users
        replaced = {r.user for r in reps}
        # A shared delegate blob is one input: its replacement covers every delegate.
        if any(u.startswith("delegate ") for u in replaced):
            replaced.update(delegate_users)
        missing = [u for u in users if u not in replaced]
        digests = {r.digest for r in reps}
        backends = sorted({r.backend for r in reps})
        if missing or len(digests) > 1:
            problem = (
                f"{', '.join(missing)} not replaced" if missing else "replaced with different bytes"
            )
            key_users = [u for u in (missing or users) if u.startswith("key ")]
            first_key = key_users[0][5:-1] if key_users else None
            raise InvalidReplacement(
                f"segment {index} of {c.source} is shared by {', '.join(users)}; "
                f"{problem}: replace every alias with identical bytes",
                backend=", ".join(backends),
                key=first_key,
            )
