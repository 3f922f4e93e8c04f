"""Hostile tied pairs and FQNs: what fails midway is a ``LayoutError`` naming the argument.

(And the plan's values: a second ``__init__`` or a left-out argument is a ``LayoutError``.)

Tied pairs go into ``ShardingPlan(tied_pairs=)``, ``build_table(tied_pairs=)``,
``merge_tied`` and ``complete_default(tied_pairs=)``; FQNs into ``build_table(fqns=)`` and
``complete_default``. An iterable that raises after a few pairs, a pair that raises or is
not two FQNs, and ``str`` subclasses whose ``__hash__``, ``__eq__`` or ``__len__`` raise
give a ``LayoutError`` (or are read as the plain text they hold), never a bare exception
and never a half-built table.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from itertools import count
from typing import Final, NoReturn

import pytest

from layout_algebra import (
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Placement,
    Shard,
    ShardingPlan,
    SourceLayout,
    TableDiff,
    build_table,
    complete_default,
    diff,
    merge_tied,
)


class Boom(Exception):
    """What the hostile values raise."""


def _boom(*_: object) -> NoReturn:
    raise Boom("hostile")


class HashRaises(str):
    __hash__ = _boom


class EqRaises(str):
    __eq__ = _boom
    __ne__ = _boom
    __hash__ = str.__hash__


class LenRaises(str):
    __len__ = _boom
    __bool__ = _boom


def _raises_after(pairs: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    yield from pairs
    raise Boom("midway")


class PairRaises:
    def __iter__(self) -> Iterator[str]:
        yield "a"
        raise Boom("inside a pair")


def _endless() -> Iterator[str]:
    return (f"w{i}" for i in count())


L: Final = SourceLayout("dense", ["tp"], [Shard(0)])
TABLE: Final = ParamLayoutTable({"a": L, "b": L, "c": L})
PLAN: Final = ShardingPlan(
    {"": ModulePlan({"a": {"tp": Shard(0)}, "b": {"tp": Shard(0)}})}, mesh_axes=["tp"]
)
PATTERN_PLAN: Final = ShardingPlan({"*": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"])

# Each entry point of tied pairs, and the name its error gives the argument.
TAKERS: Final[dict[str, tuple[Callable[[object], object], str]]] = {
    "ShardingPlan": (
        lambda pairs: ShardingPlan({}, mesh_axes=["tp"], tied_pairs=pairs),  # type: ignore[arg-type]
        "tied_pairs",
    ),
    "build_table": (
        lambda pairs: build_table(PLAN, ["tp"], tied_pairs=pairs),  # type: ignore[arg-type]
        "tied_pairs",
    ),
    "merge_tied": (lambda pairs: merge_tied(TABLE, pairs), "pairs"),  # type: ignore[arg-type]
    "complete_default": (
        lambda pairs: complete_default(TABLE, ["a", "d"], ["tp"], tied_pairs=pairs),  # type: ignore[arg-type]
        "tied_pairs",
    ),
}

BAD_PAIRS: Final[dict[str, Callable[[], object]]] = {
    "raises after a pair": lambda: _raises_after([("a", "b")]),
    "a pair that raises": lambda: [("a", "b"), PairRaises()],
    "three FQNs": lambda: [("a", "b", "c")],
    "one FQN": lambda: [("a",)],
    "an endless pair": lambda: [_endless()],
    "an FQN that is not a string": lambda: [("a", 3)],
    "an empty FQN": lambda: [("a", "")],
    "a bare string": lambda: ["ab"],
    "an FQN whose __len__ raises, empty": lambda: [("a", LenRaises(""))],
}


@pytest.mark.parametrize("taker", sorted(TAKERS))
@pytest.mark.parametrize("bad", sorted(BAD_PAIRS))
def test_bad_tied_pairs_are_a_layout_error_naming_the_argument(taker: str, bad: str) -> None:
    take, arg = TAKERS[taker]
    before = dict(TABLE)
    with pytest.raises(LayoutError) as info:
        take(BAD_PAIRS[bad]())
    assert info.value.message.startswith(f"{arg}")
    assert "tied pair" in info.value.message or "collection" in info.value.message
    assert dict(TABLE) == before and TABLE.tied == ()  # nothing half-done to the input


@pytest.mark.parametrize("taker", sorted(TAKERS))
@pytest.mark.parametrize("kind", [HashRaises, EqRaises, LenRaises])
def test_str_subclass_fqns_in_tied_pairs_are_read_as_their_text(
    taker: str, kind: type[str]
) -> None:
    take, _ = TAKERS[taker]
    plain = take([("a", "b"), ("b", "c")])
    hostile = take([(kind("a"), "b"), ("b", kind("c"))])
    assert hostile == plain
    if isinstance(hostile, ShardingPlan):
        names = [n for pair in hostile.tied_pairs for n in pair]
    else:
        assert isinstance(hostile, ParamLayoutTable)
        names = [n for group in hostile.tied for n in group]
    assert sorted(names) == ["a", "b", "b", "c"] if isinstance(hostile, ShardingPlan) else names
    assert all(type(n) is str for n in names)


def _fqn_takers() -> dict[str, Callable[[Iterable[str]], ParamLayoutTable]]:
    return {
        "complete_default": lambda fqns: complete_default(TABLE, fqns, ["tp"]),
        "complete_default of a listed table": lambda fqns: complete_default(
            build_table(PATTERN_PLAN, ["tp"], fqns=["x.w", "y.w"]), fqns, ["tp"]
        ),
        "complete_default of a table by module": lambda fqns: complete_default(
            build_table(PLAN, ["tp"]), fqns, ["tp"]
        ),
        "build_table by pattern": lambda fqns: build_table(PATTERN_PLAN, ["tp"], fqns=fqns),
        "build_table": lambda fqns: build_table(PLAN, ["tp"], fqns=fqns),
    }


@pytest.mark.parametrize("taker", sorted(_fqn_takers()))
@pytest.mark.parametrize("kind", [HashRaises, EqRaises, LenRaises])
def test_str_subclass_fqns_are_read_as_their_text(taker: str, kind: type[str]) -> None:
    take = _fqn_takers()[taker]
    names = ["a", "b", "d.w", "a", "z.w"]
    plain = take(names)
    hostile = take([kind(n) for n in names])
    assert hostile == plain and list(hostile) == list(plain)
    assert all(type(fqn) is str for fqn in hostile)


@pytest.mark.parametrize("taker", sorted(_fqn_takers()))
def test_bad_fqns_are_a_layout_error_naming_the_argument(taker: str) -> None:
    take = _fqn_takers()[taker]
    for bad in [[LenRaises("")], ["a", 3], _raises_after([("a", "b")])]:
        with pytest.raises(LayoutError, match=r"^fqns"):
            take(bad)  # type: ignore[arg-type]


# --- the plan's values: a second __init__ rewrites nothing, a left-out argument is named


def test_a_second_init_of_a_plan_or_a_diff_is_refused() -> None:
    plan = ShardingPlan({"m": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    delta = diff(TABLE, ParamLayoutTable({"a": L}))
    for value, args, kwargs in [
        (plan, ({"n": ModulePlan({})},), {"mesh_axes": ["ep"]}),
        (delta, ({"x": L}, {}, {}), {}),
    ]:
        before, hashed, copied = repr(value), hash(value), copy.deepcopy(value)
        with pytest.raises(LayoutError, match="values are immutable"):
            value.__init__(*args, **kwargs)  # type: ignore[misc]
        assert repr(value) == before and hash(value) == hashed and value == copied
    module = ModulePlan({"w": {"tp": Shard(0)}})
    module.__init__({"x": {}})  # type: ignore[misc]  # made by __new__: changes nothing
    assert module == ModulePlan({"w": {"tp": Shard(0)}}) and list(module.params) == ["w"]


@pytest.mark.parametrize(
    ("cls", "args", "kwargs", "named"),
    [
        (ShardingPlan, (), {}, "modules"),
        (ShardingPlan, ({},), {}, "mesh_axes"),
        (ModulePlan, (), {}, "params"),
        (ModulePlan, (), {"expert_parallel": True}, "params"),
        (TableDiff, (), {}, "added"),
        (TableDiff, ({}, {}), {}, "changed"),
    ],
)
def test_a_left_out_argument_is_a_layout_error_naming_it(
    cls: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(LayoutError, match=f"needs the argument '{named}', which was not given"):
        cls(*args, **kwargs)


def test_module_params_whose_keys_cannot_be_hashed_again_are_a_layout_error() -> None:
    class Path(str):
        __slots__ = ()
        armed = False

        def __hash__(self) -> int:
            if Path.armed:
                raise RuntimeError("no hashing me")
            return str.__hash__(self)

    ModulePlan({"w": {"tp": Shard(0)}})  # params with these paths already known
    params: dict[str, dict[str, Placement]] = {Path("w"): {"tp": Shard(0)}}
    Path.armed = True
    with pytest.raises(LayoutError) as info:
        ModulePlan(params)
    assert info.value.fqn == "w"


def test_equal_module_params_in_another_order_keep_their_order() -> None:
    first = ModulePlan({"a": {"tp": Shard(0)}, "b": {"tp": Shard(1)}})
    second = ModulePlan({"b": {"tp": Shard(1)}, "a": {"tp": Shard(0)}})
    assert first == second and list(second.params) == ["b", "a"]
    plan = ShardingPlan({"m": first, "n": second}, mesh_axes=["tp"])
    assert list(build_table(plan, ["tp"])) == ["m.a", "m.b", "n.b", "n.a"]
