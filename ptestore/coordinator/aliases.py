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
from ..format.model import Delegate
from ..format.users import segment_users
from .session import Replacement, Run

__all__ = ["check_aliases", "typed_users"]


def _delegate_kind(d: Delegate) -> str:
    if not d.compile_specs:
        return f"delegates of backend {d.id!r} without compile specs"
    specs = ", ".join(f"{s.key}={s.value[:16].hex()}" for s in d.compile_specs)
    return f"delegates of backend {d.id!r} with compile specs {{{specs}}}"


#: The order of the users in a message: keys, delegates, constant, mutable data.
_MESSAGE_ORDER = {"named": 0, "delegate": 1, "constant": 2, "mutable": 3}


def typed_users(run: Run, role: str, index: int) -> list[tuple[str, str]]:
    """``(kind, user)`` for every user of segment ``index`` of the ``role`` file whose
    bytes a replacement would change (from :func:`ptestore.format.users.segment_users`):
    a key shadowed by the .ptd is not read there, and a constant or mutable data segment
    that lists no offsets has no tensor in it."""
    typed: list[tuple[str, str]] = []
    used = segment_users(run.file(role).container).get(index, [])
    for u in sorted(used, key=lambda u: _MESSAGE_ORDER[u.kind]):
        if u.kind == "named":
            assert u.key is not None
            where = run.named.where(u.key) if u.key in run.named else None
            if where is not None and where[0].role != role:
                continue  # shadowed by the .ptd: not what the runtime reads
            typed.append(("named data", f"key {u.key!r}"))
        elif u.kind == "delegate":
            d = u.delegate
            assert d is not None
            typed.append((_delegate_kind(d), f"delegate {d.method}[{d.position}]"))
        elif u.offsets and u.kind == "constant":
            typed.append(("constant data", "the program's constant segment"))
        elif u.offsets:
            typed.append(("mutable data", f"mutable data segment {u.position}"))
    return typed


def _differ(run: Run, reps: list[Replacement]) -> bool:
    """Whether the replacements of one segment hold different bytes (hashed only here,
    where a segment has more than one)."""
    if len(reps) < 2:
        return False
    if len({r.size for r in reps}) > 1:
        return True
    return len({r.sha256(run.spool) for r in reps}) > 1


def _whose(run: Run, reps: list[Replacement]) -> tuple[str, str | None]:
    """``(backend, spec)`` of an error about ``reps``: the id and spec of the one backend
    that made them, or of several, their ids and ``ID: SPEC`` for each."""
    ids = sorted({r.backend for r in reps})
    specs = [run.specs.get(b) for b in ids]
    if len(ids) == 1:
        return ids[0], specs[0]
    named = [f"{b}: {s}" for b, s in zip(ids, specs, strict=True) if s is not None and s != b]
    return ", ".join(ids), ", ".join(named) or None


def check_aliases(run: Run) -> None:
    """Raise :class:`InvalidReplacement` for a replaced segment that has users of more
    than one kind, or a shared segment replaced for some of its users only, or with
    different bytes for different users."""
    for (role, index), reps in sorted(run.replacements.items()):
        c = run.file(role).container
        typed = typed_users(run, role, index)
        users = [u for _, u in typed]
        backend, spec = _whose(run, reps)
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
                backend=backend,
                spec=spec,
                key=first_key,
            )
        replaced = {r.user for r in reps}
        delegate_users = [u for u in users if u.startswith("delegate ")]
        # A shared delegate blob is one input: its replacement covers every delegate.
        if any(u.startswith("delegate ") for u in replaced):
            replaced.update(delegate_users)
        missing = [u for u in users if u not in replaced]
        if missing or _differ(run, reps):
            problem = (
                f"{', '.join(missing)} not replaced" if missing else "replaced with different bytes"
            )
            missing_keys = [u for u in (missing or users) if u.startswith("key ")]
            raise InvalidReplacement(
                f"segment {index} of {c.source} is shared by {', '.join(users)}; "
                f"{problem}: replace every alias with identical bytes",
                backend=backend,
                spec=spec,
                key=missing_keys[0][5:-1] if missing_keys else None,
            )
