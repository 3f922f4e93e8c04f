"""The error family: one base, a leaf per kind of problem, each carrying its context."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

import layout_algebra
from layout_algebra import (
    BindError,
    LayoutError,
    ModulePlan,
    OwnedAxisError,
    PlacementSyntaxError,
    PlanError,
    SerializationError,
    Shard,
    ShardingPlan,
    TiedLayoutConflict,
    UnknownAxisError,
    build_table,
    errors,
    parse_placement,
    resolve,
)

LEAVES: list[type[LayoutError]] = [
    PlacementSyntaxError,
    OwnedAxisError,
    UnknownAxisError,
    TiedLayoutConflict,
    PlanError,
    SerializationError,
    BindError,
]


def test_the_base_is_a_value_error() -> None:
    assert issubclass(LayoutError, ValueError)


@pytest.mark.parametrize("leaf", LEAVES)
def test_every_error_is_a_layout_error(leaf: type[LayoutError]) -> None:
    assert issubclass(leaf, LayoutError)
    assert issubclass(leaf, ValueError)


def test_the_package_re_exports_the_errors() -> None:
    for name in errors.__all__:
        assert getattr(layout_algebra, name) is getattr(errors, name)
    classes: list[type[LayoutError]] = [LayoutError, *LEAVES]
    assert sorted(errors.__all__) == sorted(cls.__name__ for cls in classes)


def test_layout_error_carries_fqn_axis_and_placement() -> None:
    e = LayoutError("w: S(0) on 'dp'", fqn="w", axis="dp", placement="S(0)")
    assert (e.fqn, e.axis, e.placement) == ("w", "dp", "S(0)")
    assert e.message == str(e) == "w: S(0) on 'dp'"
    bare = LayoutError("something")
    assert (bare.fqn, bare.axis, bare.placement) == (None, None, None)


@pytest.mark.parametrize(
    "error",
    [
        OwnedAxisError("m", fqn="w", axis="dp", placement="S(0)"),
        UnknownAxisError("m", fqn="w", axis="tpp", placement="S(0)"),
        BindError("m", fqn="w", axis="tp", placement="S(0)"),
    ],
)
def test_plain_leaves_take_the_base_context(error: LayoutError) -> None:
    assert (error.fqn, error.placement) == ("w", "S(0)")
    assert error.message == "m"


def test_placement_syntax_error_keeps_the_text() -> None:
    e = PlacementSyntaxError("bad", text="S(")
    assert e.text == "S("
    assert e.fqn is None


def test_tied_layout_conflict_keeps_group_placements_and_sources() -> None:
    e = TiedLayoutConflict(
        "conflict",
        group=["head.weight", "emb.weight"],
        axis="tp",
        placements=("S(0)", "S(1)"),
        sources=("emb.weight", "head.weight"),
    )
    assert e.group == ("head.weight", "emb.weight")
    assert isinstance(e.group, tuple)
    assert e.placements == ("S(0)", "S(1)")
    assert e.sources == ("emb.weight", "head.weight")
    assert (e.fqn, e.axis, e.placement) == ("emb.weight", "tp", "S(0)")


def test_plan_error_keeps_every_problem_and_the_first_ones_context() -> None:
    first = OwnedAxisError("a", fqn="w", axis="dp", placement="S(0)")
    second = UnknownAxisError("b", fqn="v", axis="tpp", placement="R")
    e = PlanError("two problems", problems=[first, second])
    assert e.problems == (first, second)
    assert isinstance(e.problems, tuple)
    assert (e.fqn, e.axis, e.placement) == ("w", "dp", "S(0)")
    empty = PlanError("none", problems=[])
    assert empty.problems == ()
    assert (empty.fqn, empty.axis, empty.placement) == (None, None, None)


def test_serialization_error_keeps_the_path() -> None:
    e = SerializationError("bad", path='entries["w"].placements[0]', fqn="w")
    assert e.path == 'entries["w"].placements[0]'
    assert e.fqn == "w"


def test_raised_errors_carry_their_context() -> None:
    with pytest.raises(OwnedAxisError) as owned:
        resolve({"dp_shard": Shard(1)}, ["dp_shard", "tp"], fqn="layers.0.wq.weight")
    assert (owned.value.fqn, owned.value.axis, owned.value.placement) == (
        "layers.0.wq.weight",
        "dp_shard",
        "S(1)",
    )
    with pytest.raises(UnknownAxisError) as unknown:
        resolve({"tpp": Shard(0)}, ["tp"], fqn="w")
    assert (unknown.value.fqn, unknown.value.axis, unknown.value.placement) == ("w", "tpp", "S(0)")
    with pytest.raises(PlacementSyntaxError) as syntax:
        parse_placement("S(")
    assert syntax.value.text == "S("


def test_a_plan_error_can_be_caught_as_a_value_error() -> None:
    plan = ShardingPlan({"m": ModulePlan({"w": {"dp": Shard(0)}})}, mesh_axes=["tp"])
    with pytest.raises(ValueError, match="the plan has 1 problem:"):
        build_table(plan, ["tp"])


def _raised(call: Callable[[], object]) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        call()
    return info.value


def _real_errors() -> list[LayoutError]:
    """One error of each kind, raised by the package itself."""
    from layout_algebra import (  # noqa: PLC0415 - only this test needs them
        ParamLayoutTable,
        SourceLayout,
        merge_tied,
        serialization,
    )

    conflicting = ParamLayoutTable(
        {
            "a.weight": SourceLayout("dense", ["tp"], [Shard(0)]),
            "b.weight": SourceLayout("dense", ["tp"], [Shard(1)]),
        }
    )
    typo = ShardingPlan(
        {"attn": ModulePlan({"wq.weight": {"tpp": Shard(0)}})}, mesh_axes=["dp_shard", "tp"]
    )
    return [
        _raised(lambda: parse_placement("shard(x)")),
        _raised(lambda: resolve({"dp_shard": Shard(0)}, ["dp_shard", "tp"], fqn="w")),
        _raised(lambda: resolve({"tpp": Shard(0)}, ["tp"], fqn="w")),
        _raised(lambda: merge_tied(conflicting, [("a.weight", "b.weight")])),
        _raised(lambda: build_table(typo, ["dp_shard", "tp"])),
        _raised(lambda: serialization.from_json('{"version": 1, "entries": 5, "tied": []}')),
    ]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_error_pickles_with_its_context(protocol: int) -> None:
    for error in _real_errors():
        back = pickle.loads(pickle.dumps(error, protocol))
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert (back.fqn, back.axis, back.placement) == (error.fqn, error.axis, error.placement)
        assert sorted(vars(back)) == sorted(vars(error))
        if isinstance(error, PlanError):
            assert isinstance(back, PlanError)
            assert [str(p) for p in back.problems] == [str(p) for p in error.problems]
