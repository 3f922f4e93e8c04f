"""The plan input: module plans, whole plans, and how parameter FQNs are formed."""

from __future__ import annotations

import copy
import pickle
import re
from collections.abc import Callable, Mapping

import attrs
import pytest
from hypothesis import given

from layout_algebra import (
    AxisName,
    LayoutError,
    ModulePlan,
    Partial,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    build_table,
)
from layout_algebra.plan import param_fqn
from tests.strategies import sharding_plans

ATTN = ModulePlan({"wq.weight": {"tp": Shard(0)}, "wo.weight": {"tp": Shard(1)}})
MOE = ModulePlan({"experts.w1": {"ep": Shard(0), "tp": Shard(1)}}, expert_parallel=True)


def test_a_module_plan_holds_named_placements() -> None:
    assert dict(ATTN.params["wq.weight"]) == {"tp": Shard(0)}
    assert list(ATTN.params) == ["wq.weight", "wo.weight"]
    assert isinstance(ATTN.params["wq.weight"], Mapping)
    assert not ATTN.expert_parallel
    assert MOE.expert_parallel


def test_a_module_plan_copies_what_it_is_given() -> None:
    named = {"tp": Shard(0)}
    params = {"w": named}
    plan = ModulePlan(params)
    named["ep"] = Shard(0)
    params["v"] = {}
    assert plan == ModulePlan({"w": {"tp": Shard(0)}})


def test_plans_are_frozen() -> None:
    plan = ShardingPlan({"": ATTN}, mesh_axes=["tp"])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.tied_pairs = ()  # type: ignore[misc]  # the point of the test
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ATTN.expert_parallel = True  # type: ignore[misc]  # the point of the test
    with pytest.raises(TypeError):
        ATTN.params["x"] = {}  # type: ignore[index]  # the point of the test


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([("w", {})], "a module plan's params must map parameter paths to named placements"),
        ({"": {}}, "parameter path '' must be a non-empty dotted name such as 'wq.weight'"),
        ({".w": {}}, "parameter path '.w' must be a non-empty dotted name"),
        ({"w.": {}}, "parameter path 'w.' must be a non-empty dotted name"),
        ({3: {}}, "parameter path 3 must be a non-empty dotted name"),
        ({"w": [("tp", Shard(0))]}, "w: named placements must be a mapping from axis to placement"),
        ({"w": {"t-p": Shard(0)}}, "w: axis name 't-p' is not an identifier"),
        ({"w": {"tp": "S(0)"}}, "w: 'S(0)' on axis 'tp' is not a placement; use Shard(d)"),
        ({"w": {"tp": Shard(0), AxisName("tp"): Replicate()}}, "w: axis 'tp' is named twice"),
    ],
)
def test_a_module_plan_checks_its_params(params: object, message: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        ModulePlan(params)  # type: ignore[arg-type]  # run-time check


def test_errors_in_params_name_the_parameter_and_axis() -> None:
    with pytest.raises(LayoutError) as info:
        ModulePlan({"wq.weight": {"tp": 0}})  # type: ignore[dict-item]  # run-time check
    assert (info.value.fqn, info.value.axis) == ("wq.weight", "tp")


def test_expert_parallel_must_be_a_bool() -> None:
    with pytest.raises(LayoutError, match="expert_parallel must be True or False, got 1"):
        ModulePlan({}, expert_parallel=1)  # type: ignore[arg-type]  # run-time check


def test_a_module_plan_may_hold_partial() -> None:
    # Plans carry what planners wrote; build_table rejects Partial for a parameter.
    assert ModulePlan({"w": {"tp": Partial()}}).params["w"]["tp"] == Partial()


def test_a_sharding_plan_holds_modules_axes_and_tied_pairs() -> None:
    plan = ShardingPlan(
        {"layers.0.attn": ATTN, "layers.1.moe": MOE},
        mesh_axes=["dp_shard", "tp", "ep"],
        tied_pairs=[["emb.weight", "head.weight"]],
    )
    assert list(plan.modules) == ["layers.0.attn", "layers.1.moe"]
    assert plan.mesh_axes == (AxisName("dp_shard"), AxisName("tp"), AxisName("ep"))
    assert plan.tied_pairs == (("emb.weight", "head.weight"),)
    assert ShardingPlan({}, mesh_axes=[]).tied_pairs == ()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ShardingPlan([("m", ATTN)], mesh_axes=["tp"]), "a plan's modules must map"),  # type: ignore[arg-type]  # run-time check
        (
            lambda: ShardingPlan({".m": ATTN}, mesh_axes=["tp"]),
            "module FQN '.m' must be a dotted name",
        ),
        (
            lambda: ShardingPlan({"m.": ATTN}, mesh_axes=["tp"]),
            "module FQN 'm.' must be a dotted name",
        ),
        (lambda: ShardingPlan({3: ATTN}, mesh_axes=["tp"]), "module FQN 3 must be a dotted name"),  # type: ignore[dict-item]  # run-time check
        (
            lambda: ShardingPlan({"m": {"w": {"tp": Shard(0)}}}, mesh_axes=["tp"]),  # type: ignore[dict-item]  # run-time check
            "module 'm': {'w': {'tp': Shard(dim=0)}} is not a ModulePlan; wrap its params",
        ),
        (
            lambda: ShardingPlan({}, mesh_axes=["tp", "ep", "tp"]),
            "mesh_axes names axis 'tp' twice: ['tp', 'ep', 'tp']; give each axis once",
        ),
        (lambda: ShardingPlan({}, mesh_axes="tp"), "not the string 'tp'"),
        (
            lambda: ShardingPlan({}, mesh_axes=[], tied_pairs=[("a",)]),
            "a tied pair is two parameter FQNs, got ('a',)",
        ),
        (
            lambda: ShardingPlan({}, mesh_axes=[], tied_pairs=[("a", "b", "c")]),
            "got ('a', 'b', 'c')",
        ),
        (lambda: ShardingPlan({}, mesh_axes=[], tied_pairs=["ab"]), "got 'ab'"),
        (lambda: ShardingPlan({}, mesh_axes=[], tied_pairs=[("a", "")]), "got ('a', '')"),
        (lambda: ShardingPlan({}, mesh_axes=[], tied_pairs=[("a", 3)]), "got ('a', 3)"),  # type: ignore[list-item]  # run-time check
    ],
)
def test_a_sharding_plan_checks_its_fields(make: Callable[[], object], message: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        make()


def test_mesh_axes_are_required() -> None:
    with pytest.raises(LayoutError, match="needs the argument 'mesh_axes'"):
        ShardingPlan({})  # type: ignore[call-arg]  # the point of the test


def test_plans_are_equal_and_hash_equal_by_value() -> None:
    a = ShardingPlan(
        {"m": ModulePlan({"w": {"tp": Shard(0)}, "b": {}})},
        mesh_axes=["tp"],
        tied_pairs=[("x", "y")],
    )
    b = ShardingPlan(
        {"m": ModulePlan({"w": {AxisName("tp"): Shard(0)}, "b": {}})},
        mesh_axes=(AxisName("tp"),),
        tied_pairs=(["x", "y"],),
    )
    assert a == b
    assert hash(a) == hash(b)
    assert a != attrs.evolve(a, tied_pairs=())
    assert a != attrs.evolve(a, mesh_axes=["tp", "ep"])
    assert ModulePlan({"w": {}}) != ModulePlan({"w": {}}, expert_parallel=True)
    assert ModulePlan({"w": {"tp": Shard(0)}}) != ModulePlan({"w": {"tp": Shard(1)}})


@given(sharding_plans(), sharding_plans())
def test_equal_plans_hash_equal(a: ShardingPlan, b: ShardingPlan) -> None:
    assert a == attrs.evolve(a)
    assert hash(a) == hash(attrs.evolve(a))
    if a == b:
        assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("module", "param", "fqn"),
    [
        ("", "weight", "weight"),
        ("", "experts.w1", "experts.w1"),
        ("layers.0", "wq.weight", "layers.0.wq.weight"),
        ("emb", "weight", "emb.weight"),
    ],
)
def test_param_fqn_joins_module_and_path(module: str, param: str, fqn: str) -> None:
    assert param_fqn(module, param) == fqn


def test_named_placements_walks_every_parameter_with_its_fqn() -> None:
    plan = ShardingPlan(
        {"": ModulePlan({"weight": {}}), "layers.1.moe": MOE, "attn": ATTN}, mesh_axes=["tp", "ep"]
    )
    walked = [(fqn, spec, dict(named)) for fqn, spec, named in plan.named_placements()]
    assert walked == [
        ("weight", plan.modules[""], {}),
        ("layers.1.moe.experts.w1", MOE, {"ep": Shard(0), "tp": Shard(1)}),
        ("attn.wq.weight", ATTN, {"tp": Shard(0)}),
        ("attn.wo.weight", ATTN, {"tp": Shard(1)}),
    ]


# --- module plans made anew for every module ----------------------------------------


def test_equal_module_plans_share_their_params_however_made() -> None:
    def params() -> dict[str, dict[str, Placement]]:
        return {"wq.weight": {"tp": Shard(0)}, "wo.weight": {"tp": Shard(1)}}

    first = ModulePlan(params())
    assert ModulePlan(params()) == first
    assert ModulePlan(params()).params is first.params  # interned: one value, one object
    assert ModulePlan(params=params(), expert_parallel=False) == first
    assert ModulePlan(params(), expert_parallel=True) != first
    assert ModulePlan(params(), expert_parallel=True) == ModulePlan(params(), expert_parallel=True)
    other_order = ModulePlan({"wo.weight": {"tp": Shard(1)}, "wq.weight": {"tp": Shard(0)}})
    assert list(other_order.params) == ["wo.weight", "wq.weight"]  # the order given is kept
    for again in (
        attrs.evolve(first),
        copy.copy(first),
        copy.deepcopy(first),
        *(pickle.loads(pickle.dumps(first, protocol)) for protocol in range(6)),
    ):
        assert again == first
        assert hash(again) == hash(first)


def test_a_planner_changing_its_dicts_changes_no_plan_made_of_them() -> None:
    named: dict[str, Placement] = {"tp": Shard(0)}
    params: dict[str, dict[str, Placement]] = {"w": named}
    before = ModulePlan(params)
    named["tp"] = Shard(1)
    after = ModulePlan(params)
    assert dict(before.params["w"]) == {"tp": Shard(0)}
    assert dict(after.params["w"]) == {"tp": Shard(1)}
    params["v"] = {"tp": Replicate()}
    assert set(ModulePlan(params).params) == {"w", "v"}
    assert set(before.params) == {"w"}


def test_a_value_whose_comparison_raises_gets_the_full_check() -> None:
    class Touchy:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing me")

        __hash__ = object.__hash__

    ModulePlan({"w": {"tp": Shard(0)}})  # a known kind of the same size
    with pytest.raises(LayoutError, match=r"w: .* on axis 'tp' is not a placement"):
        ModulePlan({"w": {"tp": Touchy()}})  # type: ignore[dict-item]


def test_a_module_plan_subclass_is_its_own_object() -> None:
    class Mine(ModulePlan):
        pass

    mine = Mine({"w": {"tp": Shard(0)}})
    assert type(mine) is Mine
    assert type(ModulePlan({"w": {"tp": Shard(0)}})) is ModulePlan
    assert mine.params == ModulePlan({"w": {"tp": Shard(0)}}).params


# --- copies of a plan ----------------------------------------------------------------


class MyPlan(ShardingPlan):
    """A planner's own kind of plan: pickled and copied as itself."""


def test_every_copy_of_a_plan_builds_its_table() -> None:
    attn = ModulePlan({"wq.weight": {"tp": Shard(0)}})
    norm = ModulePlan({"weight": {"tp": Replicate()}})
    modules = {"": norm, **{f"layers.{i}.attn": attn for i in range(3)}, "layers.0.norm": norm}
    plan = ShardingPlan(modules, mesh_axes=["tp"])
    expected = build_table(plan, ["tp"])
    assert list(expected) == ["weight"] + [f"layers.{i}.attn.wq.weight" for i in range(3)] + [
        "layers.0.norm.weight"
    ]
    for again in (
        attrs.evolve(plan),
        ShardingPlan(plan.modules, mesh_axes=["tp"]),
        copy.deepcopy(plan),
        *(pickle.loads(pickle.dumps(plan, protocol)) for protocol in range(6)),
    ):
        assert again == plan
        table = build_table(again, ["tp"])
        assert table == expected
        assert list(table) == list(expected)
    mine = MyPlan(modules, mesh_axes=["tp"])
    assert type(pickle.loads(pickle.dumps(mine))) is MyPlan
    assert type(copy.deepcopy(mine)) is MyPlan


@pytest.mark.parametrize(
    ("key", "match"),
    [
        ("layers..attn", "must be a dotted name"),
        (".attn", "must be a dotted name"),
        ("attn.", "must be a dotted name"),
        ("la*yers.attn", "must be a dotted name"),
        (7, "must be a dotted name"),
    ],
)
def test_a_bad_module_key_among_good_ones_is_named(key: object, match: str) -> None:
    attn = ModulePlan({"wq.weight": {"tp": Shard(0)}})
    modules: dict[object, object] = {f"layers.{i}.attn": attn for i in range(100)}
    modules[key] = attn
    modules[""] = attn
    with pytest.raises(LayoutError, match=match) as info:
        ShardingPlan(modules, mesh_axes=["tp"])  # type: ignore[arg-type]
    assert info.value.fqn == (key if isinstance(key, str) else repr(key))


def test_a_str_subclass_as_module_key_is_refused() -> None:
    class Name(str):
        __slots__ = ()

    attn = ModulePlan({"wq.weight": {"tp": Shard(0)}})
    with pytest.raises(LayoutError, match="must be a dotted name"):
        ShardingPlan({Name("attn"): attn}, mesh_axes=["tp"])
    with pytest.raises(LayoutError, match="is not a ModulePlan"):
        ShardingPlan({"attn": attn, "norm": {"weight": {}}}, mesh_axes=["tp"])  # type: ignore[dict-item]
