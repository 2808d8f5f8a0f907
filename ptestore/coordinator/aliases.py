"""Alias checks: a segment shared by several users must be replaced consistently for all
of them (or not at all), and only when every user is of one kind.

The users of a segment are the named-data keys the runtime reads from it, the delegates
whose processed blob it is, the program's constant segment and its mutable data
segments. Users of different kinds (a key and the constant segment, a blob shared by
delegates of two backends, or of one backend with different compile specs) cannot all
want the same new bytes, so replacing such a segment is refused.
"""

from __future__ import annotations

from ..errors import InvalidReplacement
from ..format.model import Container, Delegate
from .session import Run

__all__ = ["check_aliases", "segment_users"]


def _delegate_kind(d: Delegate) -> str:
    if not d.compile_specs:
        return f"delegates of backend {d.id!r} without compile specs"
    specs = ", ".join(f"{s.key}={s.value[:16].hex()}" for s in d.compile_specs)
    return f"delegates of backend {d.id!r} with compile specs {{{specs}}}"


def segment_users(run: Run, role: str, index: int) -> list[tuple[str, str]]:
    """``(kind, user)`` for every user of segment ``index`` of the ``role`` file."""
    c: Container = run.file(role).container
    users: list[tuple[str, str]] = []
    for e in c.named_data:
        if e.segment_index != index:
            continue
        where = run.named.where(e.key) if e.key in run.named else None
        if where is not None and where[0].role != role:
            continue  # shadowed by the .ptd: not what the runtime reads
        users.append(("named data", f"key {e.key!r}"))
    if role != "pte":
        return users
    for d in c.delegates:
        if d.location == "segment" and d.index == index:
            users.append((_delegate_kind(d), f"delegate {d.method}[{d.position}]"))
    cs = c.constant_segment
    if cs is not None and cs.offsets and cs.segment_index == index:
        users.append(("constant data", "the program's constant segment"))
    for i, m in enumerate(c.mutable_data_segments):
        if m.offsets and m.segment_index == index:
            users.append(("mutable data", f"mutable data segment {i}"))
    return users


def check_aliases(run: Run) -> None:
    """Raise :class:`InvalidReplacement` for a replaced segment that has users of more
    than one kind, or a shared segment replaced for some of its users only, or with
    different bytes for different users."""
    for (role, index), reps in sorted(run.replacements.items()):
        c = run.file(role).container
        typed = segment_users(run, role, index)
        users = [u for _, u in typed]
        backends = sorted({r.backend for r in reps})
        key_users = [u for u in users if u.startswith("key ")]
        first_key = key_users[0][5:-1] if key_users else None
        kinds: dict[str, list[str]] = {}
        for kind, user in typed:
            kinds.setdefault(kind, []).append(user)
        if len(kinds) > 1:
            groups = "; ".join(f"{kind}: {', '.join(us)}" for kind, us in kinds.items())
            raise InvalidReplacement(
                f"segment {index} of {c.source} has users of different kinds ({groups}); "
                "replacing it would change the bytes of every one of them: refused (only a "
                "segment whose users are all named-data keys, or all delegates of one "
                "backend with the same compile specs, can be replaced)",
                backend=", ".join(backends),
                key=first_key,
            )
        replaced = {r.user for r in reps}
        delegate_users = [u for u in users if u.startswith("delegate ")]
        # A shared delegate blob is one input: its replacement covers every delegate.
        if any(u.startswith("delegate ") for u in replaced):
            replaced.update(delegate_users)
        missing = [u for u in users if u not in replaced]
        digests = {r.digest for r in reps}
        if missing or len(digests) > 1:
            problem = (
                f"{', '.join(missing)} not replaced" if missing else "replaced with different bytes"
            )
            missing_keys = [u for u in (missing or users) if u.startswith("key ")]
            raise InvalidReplacement(
                f"segment {index} of {c.source} is shared by {', '.join(users)}; "
                f"{problem}: replace every alias with identical bytes",
                backend=", ".join(backends),
                key=missing_keys[0][5:-1] if missing_keys else None,
            )
