"""``ptestore._dataclass.dataclass`` behaves as ``dataclasses.dataclass`` (without
importing :mod:`dataclasses` or compiling more than ``__init__`` per class): the same
class shapes made both ways give the same reprs, equalities, hashes, errors, signatures
and dataclass helpers; and every ptestore module uses it."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ptestore._dataclass import dataclass as cheap
from ptestore._dataclass import field as cheap_field
from ptestore._dataclass import replace as cheap_replace


def _shapes(make: Any, field: Any = dataclasses.field) -> dict[str, type]:
    """The class shapes ptestore uses, made with ``make`` and ``field``."""

    @make(frozen=True)
    class Frozen:
        a: int
        b: str = "x"
        c: list[int] = field(default_factory=list, compare=False)
        d: int = field(default=0, repr=False)
        e: int = field(default=0, hash=False)

    @make
    class Mutable:
        a: int
        b: list[int] = field(default_factory=list)

    @make(frozen=True)
    class OwnHash:
        a: int

        def __hash__(self) -> int:
            return 7

    @make(frozen=True)
    class OwnEq:
        a: int

        def __eq__(self, other: object) -> bool:
            return True

    @make(frozen=True)
    class OwnRepr:
        a: int

        def __repr__(self) -> str:
            return "mine"

    @make(frozen=True, eq=False)
    class NoEq:
        a: int

    @make(frozen=True)
    class Empty:
        pass

    @make(frozen=True)
    class One:
        a: int

    @make(frozen=True)
    class Child(Frozen):
        f: int = 5

    @make
    class Node:
        name: str
        next: Any = None

    @make(frozen=True)
    class Post:
        a: int
        doubled: int = field(init=False, default=0)

        def __post_init__(self) -> None:
            object.__setattr__(self, "doubled", self.a * 2)

    return {
        c.__name__: c
        for c in (Frozen, Mutable, OwnHash, OwnEq, OwnRepr, NoEq, Empty, One, Child, Node, Post)
    }


STD = _shapes(dataclasses.dataclass)
OURS = _shapes(cheap)
#: ptestore's own ``field`` (what its modules use), not the standard one
OURS_FIELD = _shapes(cheap, cheap_field)

CASES: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = [
    ("Frozen", (1, "y", [1], 2, 3), (1, "y", [9], 2, 4)),
    ("Frozen", (1,), (2,)),
    ("Mutable", (1, [2]), (1, [3])),
    ("OwnHash", (1,), (2,)),
    ("OwnEq", (1,), (2,)),
    ("OwnRepr", (1,), (1,)),
    ("NoEq", (1,), (1,)),
    ("Empty", (), ()),
    ("One", (1,), (1,)),
    ("Child", (1, "y", [], 0, 0, 6), (1, "y", [], 0, 0, 7)),
    ("Post", (4,), (4,)),
]


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:  # the type and message are the behaviour compared
        return ("raised", type(exc).__name__, re.sub(r"0x[0-9a-f]+", "ADDR", str(exc)))


@pytest.mark.parametrize(("name", "args", "other"), CASES)
def test_the_same_behaviour_as_the_standard_decorator(
    name: str, args: tuple[Any, ...], other: tuple[Any, ...]
) -> None:
    def behaviour(classes: dict[str, type]) -> list[Any]:
        cls = classes[name]
        x, y, z = cls(*args), cls(*args), cls(*other)
        out = [
            repr(x),
            _outcome(lambda: x == y),
            _outcome(lambda: x == z),
            _outcome(lambda: x != z),
            _outcome(lambda: x == object()),
            _outcome(lambda: x.__eq__(object())),
            _outcome(lambda: hash(x) == hash(y)),
            _outcome(lambda: hash(x) == hash(z)),
            _outcome(lambda: dataclasses.asdict(x)),
            _outcome(lambda: [f.name for f in dataclasses.fields(cls)]),
            _outcome(lambda: dataclasses.replace(x) == x),
            cls.__hash__ is None,
            getattr(cls, "__match_args__", None),
            str(inspect.signature(cls)),
            dataclasses.is_dataclass(cls),
            [(f.name, f.type, f.init, f.repr, f.compare, f.hash) for f in dataclasses.fields(cls)],
            cls.__dataclass_params__.frozen,  # type: ignore[attr-defined]
            _outcome(lambda: repr(cls())),
            _outcome(lambda: repr(cls(*args, *args))),
            _outcome(lambda: repr(cls(*args, nope=1))),
            _outcome(lambda: repr(dataclasses.replace(x, a=5))),
            _outcome(lambda: repr(dataclasses.replace(x, doubled=5))),
        ]
        if name != "Mutable":
            out.append(_outcome(lambda: setattr(x, "a", 99)))
            out.append(_outcome(lambda: delattr(x, "a")))
        return out

    assert behaviour(OURS) == behaviour(STD)
    assert behaviour(OURS_FIELD) == behaviour(STD)


@pytest.mark.parametrize(("name", "args", "other"), CASES)
def test_replace_without_dataclasses_is_the_standard_replace(
    name: str, args: tuple[Any, ...], other: tuple[Any, ...]
) -> None:
    def outcomes(classes: dict[str, type], replace: Any) -> list[Any]:
        x = classes[name](*args)
        return [
            _outcome(lambda: repr(replace(x))),
            _outcome(lambda: repr(replace(x, a=5))),
            _outcome(lambda: repr(replace(x, doubled=5))),
            _outcome(lambda: repr(replace(x, nope=5))),
        ]

    assert outcomes(OURS_FIELD, cheap_replace) == outcomes(STD, dataclasses.replace)


def test_class_errors_are_the_standard_ones() -> None:
    def errors(make: Any, field: Any) -> list[Any]:
        def mutable() -> None:
            @make
            class C:
                a: list[int] = []  # noqa: RUF012 - the mistake refused

        def order() -> None:
            @make
            class C:
                a: int = 0
                b: int

        def frozen_from_mutable() -> None:
            @make
            class Base:
                a: int = 0

            @make(frozen=True)
            class C(Base):
                b: int = 0

        def own_setattr() -> None:
            @make(frozen=True)
            class C:
                a: int = 0

                def __setattr__(self, name: str, value: Any) -> None:
                    pass

        return [
            _outcome(mutable),
            _outcome(order),
            _outcome(frozen_from_mutable),
            _outcome(own_setattr),
            _outcome(lambda: field(default=1, default_factory=list)),
        ]

    assert errors(cheap, cheap_field) == errors(dataclasses.dataclass, dataclasses.field)


def test_classvars_options_it_leaves_to_the_standard_and_a_fresh_process() -> None:
    @cheap(frozen=True)
    class WithClassVar:
        limit: ClassVar[int] = 3
        other: typing.ClassVar[str] = "x"
        a: int = 1

    assert [f.name for f in dataclasses.fields(WithClassVar)] == ["a"]
    assert WithClassVar().limit == 3

    @cheap(order=True)
    class Ordered:
        a: int
        b: list[int] = cheap_field(default_factory=list)

    assert Ordered(1) < Ordered(2) and Ordered(1).b == []

    @cheap
    class OnStandardBase(Ordered):
        c: int = 0

    assert OnStandardBase(1, [2], 3) == OnStandardBase(1, [2], 3)
    assert [f.name for f in dataclasses.fields(OnStandardBase)] == ["a", "b", "c"]
    # what a CLI run pays: ptestore's classes made without importing dataclasses
    code = (
        "import sys, ptestore.coordinator.inplace, ptestore.format.patch, "
        "ptestore.coordinator.report, ptestore.provenance.record; "
        "print('dataclasses' in sys.modules, 'inspect' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_subclass_is_not_equal_and_a_cycle_is_shown_as_dots() -> None:
    for classes in (STD, OURS):
        frozen, child, node = classes["Frozen"], classes["Child"], classes["Node"]
        assert frozen(1) != child(1)
        n = node("a")
        n.next = n
        assert repr(n).endswith("Node(name='a', next=...)")
    assert OURS["Frozen"].__eq__.__qualname__.endswith("Frozen.__eq__")


def test_every_ptestore_dataclass_is_made_by_the_cheap_decorator() -> None:
    root = Path(__file__).resolve().parents[2] / "ptestore"
    offenders = [
        str(p.relative_to(root.parent))
        for p in root.rglob("*.py")
        if p.name != "_dataclass.py"
        and re.search(r"^from dataclasses import .*\bdataclass\b", p.read_text(), re.M)
    ]
    assert offenders == []
