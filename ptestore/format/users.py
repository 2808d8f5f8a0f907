"""Who references each segment of a container: the one walk over a container's
references that the alias check, ``inspect`` and the layout map share.

A segment's users are the named-data keys stored in it, the delegates whose processed
blob it is, the program's constant segment and its mutable data segments. Each caller
words them for its own reader (:attr:`SegmentUser.label` is the short form ``inspect``
prints); the walk, and so the answer to "who uses segment N", is here only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from .._dataclass import dataclass
from .model import Delegate, NamedDataEntry, SubsegmentOffsets

__all__ = ["References", "SegmentUser", "UserKind", "segment_users"]

#: The four kinds of user, in the order :func:`segment_users` lists them.
UserKind = Literal["delegate", "constant", "mutable", "named"]


class References(Protocol):
    """What the walk reads: a :class:`~ptestore.format.model.Container` has it, and so
    can a view rebuilt from a :func:`ptestore.describe` object (the layout map)."""

    @property
    def named_data(self) -> Sequence[NamedDataEntry]: ...

    @property
    def delegates(self) -> Sequence[Delegate]: ...

    @property
    def constant_segment(self) -> SubsegmentOffsets | None: ...

    @property
    def mutable_data_segments(self) -> Sequence[SubsegmentOffsets]: ...


@dataclass(frozen=True)
class SegmentUser:
    """One reference to a segment."""

    segment: int
    kind: UserKind
    #: ``delegate forward[0] XnnpackBackend``, ``constant data``, ``mutable data 1``,
    #: ``key fc1.weight``.
    label: str
    #: the delegate (``kind == "delegate"``)
    delegate: Delegate | None = None
    #: the named-data key (``kind == "named"``)
    key: str | None = None
    #: the mutable data segment's position (``kind == "mutable"``)
    position: int = 0
    #: how many offsets the constant or mutable data segment lists (0: none, so nothing
    #: in the program reads it)
    offsets: int = 0

    def __str__(self) -> str:
        return self.label


def segment_users(c: References) -> dict[int, list[SegmentUser]]:
    """``segment index -> its users``: delegates (in program order), the constant
    segment, the mutable data segments, named-data keys (in file order). A segment
    nothing references has no entry."""
    users: dict[int, list[SegmentUser]] = {}

    def add(user: SegmentUser) -> None:
        users.setdefault(user.segment, []).append(user)

    for d in c.delegates:
        if d.location == "segment":
            add(SegmentUser(d.index, "delegate", f"delegate {d.method}[{d.position}] {d.id}", d))
    cs = c.constant_segment
    if cs is not None:
        add(SegmentUser(cs.segment_index, "constant", "constant data", offsets=len(cs.offsets)))
    for i, m in enumerate(c.mutable_data_segments):
        add(
            SegmentUser(
                m.segment_index, "mutable", f"mutable data {i}", position=i, offsets=len(m.offsets)
            )
        )
    for e in c.named_data:
        add(SegmentUser(e.segment_index, "named", f"key {e.key}", key=e.key))
    return users
