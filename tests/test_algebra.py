"""The layout algebra: strip, resolve, merge_tied, complete_default, build_table and diff.

The unit tests walk the cases of the planner code this package replaces (owned axes,
source-axis order, owned-axis conflicts, routing, resolution, tied pairs and the details
around them); the properties check the algebra's laws and that ``build_table`` is the
composition of the single steps.
"""

from __future__ import annotations

import pickle
import random
import re
from collections.abc import Callable, Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from layout_algebra import (
    FSDP_OWNED_AXES,
    AxisName,
    LayoutError,
    ModulePlan,
    OwnedAxisError,
    ParamLayoutTable,
    Partial,
    Placement,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    TableDiff,
    TiedLayoutConflict,
    UnknownAxisError,
    build_table,
    complete_default,
    compose_table,
    diff,
    lint,
    merge_tied,
    resolve,
    strip,
)
from layout_algebra._complete import shard_dims_by_role
from layout_algebra._patterns import Matcher, Rule
from layout_algebra.plan import NamedPlacements
from tests.strategies import (
    KNOWN_SOURCE_AXES,
    OWNED,
    axis_sequences,
    build_meshes,
    param_fqns,
    placements,
    sharding_plans,
    table_pairs,
    tables,
    tables_and_pairs,
    tied_plans,
    wild_plans,
)

R = Replicate()
S0, S1 = Shard(0), Shard(1)


def dense(**placements: Placement) -> SourceLayout:
    """A dense layout with the given placements, in keyword order: ``dense(tp=S0)``."""
    return SourceLayout("dense", list(placements), list(placements.values()))


def expert(**placements: Placement) -> SourceLayout:
    """An expert layout with the given placements, in keyword order."""
    return SourceLayout("expert", list(placements), list(placements.values()))


def names(axes: Sequence[AxisName]) -> list[str]:
    return [a.name for a in axes]


# --- strip: case 1 (the owned axes) and case 2 (source axes, order kept) --------------------


def test_strip_drops_the_owned_axes_keeping_order() -> None:
    assert names(strip(["fsdp_replicate", "fsdp_shard", "tp"])) == ["tp"]
    assert names(strip(["ep", "dp", "tp", "cp"])) == ["ep", "tp"]
    assert names(strip(["tp", "ep"])) == ["tp", "ep"]
    assert strip([]) == ()
    assert strip(["dp_shard", "cp"]) == ()


@pytest.mark.parametrize("axis", OWNED)
def test_every_owned_axis_is_stripped(axis: str) -> None:
    assert names(strip(["tp", axis, "ep"])) == ["tp", "ep"]


def test_strip_takes_other_owned_axes() -> None:
    assert names(strip(["dp_shard", "tp", "ep"], owned=["ep"])) == ["dp_shard", "tp"]
    assert names(strip(["dp_shard", "tp"], owned=())) == ["dp_shard", "tp"]


@given(axis_sequences(max_size=8), st.sets(st.sampled_from([*KNOWN_SOURCE_AXES, *OWNED])))
def test_strip_is_idempotent_and_keeps_order(axes: list[str], owned: set[str]) -> None:
    once = strip(axes, owned=owned)
    assert strip(once, owned=owned) == once
    assert names(once) == [a for a in axes if a not in owned]
    assert strip(axes) == strip(strip(axes))


# --- resolve: cases 4 and 6 ------------------------------------------------------------


def test_resolve_orders_by_source_axes_and_fills_replicate() -> None:
    layout = resolve({"tp": S0}, ["dp_shard", "ep", "tp"])
    assert layout == dense(ep=R, tp=S0)
    assert str(layout) == "dense[ep=R, tp=S(0)]"
    assert resolve({"ep": S1, "tp": S0}, ["tp", "ep"]) == dense(tp=S0, ep=S1)
    assert resolve({}, ["tp", "ep"]) == dense(tp=R, ep=R)


def test_resolve_keeps_the_mesh_role() -> None:
    assert resolve({"ep": S0}, ["edp_shard", "ep"], mesh="expert") == expert(ep=S0)


def test_placements_are_a_tuple_even_for_one_axis() -> None:
    layout = resolve({"tp": S0}, ["tp"])
    assert layout.placements == (S0,)
    assert isinstance(layout.placements, tuple)


def test_replicate_on_an_owned_axis_is_fine() -> None:
    assert resolve({"dp_shard": R, "tp": S0}, ["dp_shard", "tp"]) == dense(tp=S0)


_OWNER = {
    "pp": "pipeline ownership of that axis (each pipeline stage holds different parameters)",
    "cp": "context-parallel ownership of that axis (FSDP shards weights over it)",
}


@pytest.mark.parametrize("axis", OWNED)
def test_a_shard_on_any_owned_axis_conflicts_with_its_owner(axis: str) -> None:
    with pytest.raises(OwnedAxisError) as info:
        resolve({axis: S1}, [axis, "tp"], fqn="layers.0.wq.weight")
    owner = _OWNER.get(axis, "FSDP ownership of that axis")
    assert str(info.value) == (
        f"layers.0.wq.weight: S(1) on axis {axis!r} conflicts with {owner}; "
        "declare R or remove the axis"
    )
    assert (info.value.fqn, info.value.axis, info.value.placement) == (
        "layers.0.wq.weight",
        axis,
        "S(1)",
    )


@pytest.mark.parametrize("placement", [S0, Partial(), StridedShard(0, split_factor=2)])
def test_an_owned_axis_is_checked_even_when_the_mesh_lacks_it(placement: Placement) -> None:
    with pytest.raises(OwnedAxisError, match="'cp' conflicts with context-parallel ownership"):
        resolve({"cp": placement}, ["tp"])
    with pytest.raises(OwnedAxisError):
        resolve({"cp": placement}, ["tp"], inactive=["cp"])


def test_an_owned_axis_conflict_is_reported_before_a_typo() -> None:
    with pytest.raises(OwnedAxisError):
        resolve({"tpp": S0, "dp": S0}, ["tp"])


def test_a_typo_is_an_unknown_axis() -> None:
    with pytest.raises(UnknownAxisError) as info:
        resolve({"tpp": S0}, ["dp_shard", "tp"], fqn="w")
    assert str(info.value) == (
        "w: S(0) on axis 'tpp', which the dense mesh (source axes ['tp']) does not have and "
        "the run does not know; fix the axis name, or pass it in inactive= if this run knows it"
    )
    assert (info.value.fqn, info.value.axis, info.value.placement) == ("w", "tpp", "S(0)")


def test_an_inactive_axis_is_dropped() -> None:
    assert resolve({"tp": S0, "ep": S0}, ["tp"], inactive=["ep"]) == dense(tp=S0)
    assert resolve({"ep": S0}, ["ep"], inactive=["ep"]) == dense(ep=S0)


def test_resolve_uses_the_owned_axes_it_is_given() -> None:
    with pytest.raises(OwnedAxisError) as info:
        resolve({"tp": S0}, ["tp", "ep"], owned=["tp"], fqn="w")
    assert (info.value.fqn, info.value.axis, info.value.placement) == ("w", "tp", "S(0)")
    assert resolve({"dp": S0}, ["dp"], owned=()) == dense(dp=S0)


def test_a_mesh_of_owned_axes_gives_a_layout_with_no_axes() -> None:
    layout = resolve({"cp": R}, ["cp"])
    assert (layout.mesh, layout.axes, layout.placements) == ("dense", (), ())


def test_a_mesh_names_each_axis_once() -> None:
    with pytest.raises(LayoutError, match="the dense mesh names axis 'tp' twice"):
        resolve({}, ["tp", "ep", "tp"])


def test_resolve_passes_partial_on_to_the_layout() -> None:
    # A layout may hold Partial; the table (and build_table) reject it for parameters.
    assert resolve({"tp": Partial()}, ["tp"]) == dense(tp=Partial())


@given(
    axis_sequences(max_size=6),
    st.dictionaries(st.sampled_from(KNOWN_SOURCE_AXES), placements(), max_size=3),
)
def test_resolve_gives_one_placement_per_source_axis(
    axes: list[str], named: dict[str, Placement]
) -> None:
    known = {a for a in KNOWN_SOURCE_AXES if a not in axes}
    layout = resolve(named, axes, inactive=known)
    assert layout.axes == strip(axes)
    assert len(layout.placements) == len(strip(axes))
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        assert p == named.get(axis.name, R)


# --- merge_tied: case 7 ------------------------------------------------------------------


def test_replicate_takes_the_other_side_whichever_side_it_is() -> None:
    table = ParamLayoutTable({"emb.weight": dense(tp=R), "head.weight": dense(tp=S0)})
    for pair in [("emb.weight", "head.weight"), ("head.weight", "emb.weight")]:
        merged = merge_tied(table, [pair])
        assert merged == ParamLayoutTable(
            {"emb.weight": dense(tp=S0), "head.weight": dense(tp=S0)},
            tied=[{"emb.weight", "head.weight"}],
        )


def test_the_finer_sharding_wins_per_axis() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0, ep=R), "b": dense(tp=R, ep=S1)})
    merged = merge_tied(table, [("a", "b")])
    assert merged["a"] == merged["b"] == dense(tp=S0, ep=S1)
    same = ParamLayoutTable({"a": dense(tp=S1), "b": dense(tp=S1)})
    assert dict(merge_tied(same, [("b", "a")])) == dict(same)


def test_shard_on_different_dims_conflicts() -> None:
    table = ParamLayoutTable(
        {"emb.weight": dense(tp=S0, ep=R), "x": dense(tp=R), "head.weight": dense(tp=S1, ep=R)}
    )
    with pytest.raises(TiedLayoutConflict) as info:
        merge_tied(table, [("head.weight", "emb.weight")])
    e = info.value
    assert str(e) == (
        "tied group ['emb.weight', 'head.weight']: emb.weight has S(0) but head.weight has "
        "S(1) on axis 'tp'; a shared storage has one sharding per axis; make both placements "
        "equal (or R on one side to take the other)"
    )
    assert e.group == ("emb.weight", "head.weight")
    assert e.axis == "tp"
    assert e.placements == ("S(0)", "S(1)")
    assert e.sources == ("emb.weight", "head.weight")


def test_a_conflict_names_the_member_each_placement_came_from() -> None:
    table = ParamLayoutTable({"a": dense(tp=R), "b": dense(tp=S1), "c": dense(tp=S0)})
    with pytest.raises(TiedLayoutConflict) as info:
        merge_tied(table, [("a", "b"), ("b", "c")])
    assert info.value.sources == ("b", "c")
    assert info.value.placements == ("S(1)", "S(0)")
    assert info.value.group == ("a", "b", "c")


def test_strided_shard_and_shard_conflict() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=StridedShard(0, split_factor=2))})
    with pytest.raises(TiedLayoutConflict, match=re.escape("a has S(0) but b has _S(0, 2)")):
        merge_tied(table, [("a", "b")])


def test_tied_parameters_on_different_meshes_conflict() -> None:
    table = ParamLayoutTable({"emb.weight": dense(ep=S0), "head.weight": expert(ep=S0)})
    with pytest.raises(TiedLayoutConflict) as info:
        merge_tied(table, [("emb.weight", "head.weight")])
    assert str(info.value) == (
        "tied group ['emb.weight', 'head.weight']: emb.weight has dense[ep=S(0)] but "
        "head.weight has expert[ep=S(0)]; storage-sharing parameters must live on one mesh "
        "with the same axes; give them the same mesh and axes in the plan"
    )
    assert info.value.axis is None
    assert info.value.placements == ("dense[ep=S(0)]", "expert[ep=S(0)]")


# (A plain member, dense(), takes the other's layout: see the plain parameters below.)
@pytest.mark.parametrize("other", [dense(ep=S0), dense(tp=S0, ep=R), dense(ep=R, tp=S0)])
def test_tied_parameters_on_different_axes_conflict(other: SourceLayout) -> None:
    table = ParamLayoutTable({"a": dense(tp=S0), "b": other})
    with pytest.raises(TiedLayoutConflict, match="must live on one mesh with the same axes"):
        merge_tied(table, [("a", "b")])


def test_pairs_close_transitively() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=R), "c": dense(tp=R)})
    merged = merge_tied(table, [("a", "b"), ("b", "c")])
    assert merged.tied == (frozenset("abc"),)
    assert merged["a"] == merged["b"] == merged["c"] == dense(tp=S0)


def test_the_result_does_not_depend_on_pair_order() -> None:
    # The original planner code let a chain's result depend on the order of its pairs.
    table = ParamLayoutTable(
        {"a": dense(tp=R, ep=S0), "b": dense(tp=R, ep=R), "c": dense(tp=S1, ep=R)}
    )
    orders = [
        [("a", "b"), ("b", "c")],
        [("b", "c"), ("a", "b")],
        [("c", "b"), ("b", "a")],
        [("b", "a"), ("c", "b")],
    ]
    results = [merge_tied(table, pairs) for pairs in orders]
    assert all(r == results[0] for r in results)
    assert results[0]["a"] == dense(tp=S1, ep=S0)


def test_a_conflict_through_a_chain_is_found() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=R), "c": dense(tp=S1)})
    for pairs in ([("a", "b"), ("b", "c")], [("c", "b"), ("b", "a")]):
        with pytest.raises(TiedLayoutConflict, match="a has S\\(0\\) but c has S\\(1\\)"):
            merge_tied(table, pairs)


def test_a_missing_member_takes_the_group_layout() -> None:
    table = ParamLayoutTable({"emb.weight": dense(tp=S0), "norm.weight": dense(tp=R)})
    merged = merge_tied(table, [("head.weight", "emb.weight")])
    assert list(merged) == ["emb.weight", "norm.weight", "head.weight"]
    assert merged["head.weight"] == dense(tp=S0)
    assert merged.tied == (frozenset({"emb.weight", "head.weight"}),)


def test_a_group_with_no_member_in_the_table_is_ignored() -> None:
    table = ParamLayoutTable({"emb.weight": dense(tp=S0)})
    merged = merge_tied(table, [("head.weight", "out.weight")])
    assert merged == table
    assert merged.tied == ()
    assert "head.weight" not in merged


def test_a_parameter_tied_to_itself_makes_no_group() -> None:
    table = ParamLayoutTable({"w": dense(tp=S0)})
    assert merge_tied(table, [("w", "w")]).tied == ()


def test_existing_groups_join_new_pairs() -> None:
    table = ParamLayoutTable(
        {"a": dense(tp=S0), "b": dense(tp=S0), "c": dense(tp=R)}, tied=[{"a", "b"}]
    )
    merged = merge_tied(table, [("c", "b")])
    assert merged.tied == (frozenset("abc"),)
    assert merged["c"] == dense(tp=S0)
    assert merge_tied(table, []) == table


def test_merge_tied_leaves_its_input_alone() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=R)})
    merge_tied(table, [("a", "b"), ("a", "z")])
    assert table == ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=R)})
    assert table.tied == ()


def _outcome(table: ParamLayoutTable, pairs: Sequence[Sequence[str]]) -> object:
    """The merged table, or what the conflict says: equal for equal outcomes."""
    try:
        merged = merge_tied(table, pairs)
    except TiedLayoutConflict as e:
        return (e.group, e.axis, e.placements, e.sources)
    return (list(merged.items()), merged.tied)


@given(tables_and_pairs(), st.data())
def test_merge_tied_ignores_pair_order_and_orientation(
    table_pairs: tuple[ParamLayoutTable, list[tuple[str, str]]], data: st.DataObject
) -> None:
    table, pairs = table_pairs
    shuffled = data.draw(st.permutations(pairs))
    flips = data.draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    flipped = [(b, a) if flip else (a, b) for (a, b), flip in zip(shuffled, flips, strict=True)]
    assert _outcome(table, flipped) == _outcome(table, pairs)


@given(tables_and_pairs())
def test_merge_tied_is_idempotent_and_gives_each_group_one_layout(
    table_pairs: tuple[ParamLayoutTable, list[tuple[str, str]]],
) -> None:
    table, pairs = table_pairs
    try:
        merged = merge_tied(table, pairs)
    except TiedLayoutConflict:
        return
    assert merge_tied(merged, pairs) == merged
    assert merge_tied(merged, ()) == merged
    for group in merged.tied:
        assert len({merged[fqn] for fqn in group}) == 1
    for a, b in pairs:
        if a != b and (a in table or b in table):
            assert merged.group_of(a) == merged.group_of(b)
            assert merged[a] == merged[b]
    assert list(merged)[: len(table)] == list(table)
    for fqn in table:
        if len(merged.group_of(fqn)) == 1:
            assert merged[fqn] == table[fqn]


# --- complete_default ---------------------------------------------------------------------


def test_complete_default_fills_missing_parameters_with_replicate() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0)})
    done = complete_default(table, ["a", "b", "c"], ["dp_shard", "tp", "ep"])
    assert list(done.items()) == [
        ("a", dense(tp=S0)),
        ("b", dense(tp=R, ep=R)),
        ("c", dense(tp=R, ep=R)),
    ]
    assert complete_default(table, ["b"], ["ep"], mesh="expert")["b"] == expert(ep=R)
    assert complete_default(table, ["b"], ["tp", "sp"], owned=["tp"])["b"] == dense(sp=R)


def test_complete_default_keeps_existing_entries_and_groups() -> None:
    table = ParamLayoutTable({"a": expert(ep=S0), "b": expert(ep=S0)}, tied=[{"a", "b"}])
    done = complete_default(table, ["a", "b"], ["tp"])
    assert done == table
    assert done.tied == table.tied


def test_complete_default_needs_a_source_axis() -> None:
    with pytest.raises(LayoutError) as info:
        complete_default(ParamLayoutTable({}), ["w"], ["dp_shard", "cp"])
    assert str(info.value) == (
        "the dense mesh ['dp_shard', 'cp'] has no source axis (all are owned by "
        "FSDP/pipelining), so there is no default layout; give a mesh with a non-owned axis "
        "such as 'tp'"
    )


def test_complete_default_checks_its_input() -> None:
    with pytest.raises(LayoutError, match="a parameter FQN must be a non-empty string, got ''"):
        complete_default(ParamLayoutTable({}), [""], ["tp"])
    with pytest.raises(LayoutError) as info:
        complete_default(ParamLayoutTable({}), ["w"], ["tp", "tp"])
    assert info.value.axis == "tp"


@given(
    tables(),
    st.lists(param_fqns(), max_size=6),
    st.lists(st.sampled_from(KNOWN_SOURCE_AXES), unique=True, min_size=1),
    st.lists(st.sampled_from(OWNED), unique=True, max_size=2),
    st.data(),
)
def test_complete_default_never_changes_an_existing_entry(
    table: ParamLayoutTable,
    fqns: list[str],
    source: list[str],
    owned: list[str],
    data: st.DataObject,
) -> None:
    axes = data.draw(st.permutations([*source, *owned]))
    done = complete_default(table, fqns, axes)
    assert list(done)[: len(table)] == list(table)
    assert set(done) == set(table) | set(fqns)
    assert done.tied == table.tied
    for fqn, layout in done.items():
        if fqn in table:
            assert layout is table[fqn]
        else:
            assert layout == SourceLayout("dense", strip(axes), [R] * len(source))


# --- build_table: the whole plan -------------------------------------------------------------

DENSE = ("dp_shard", "tp")
EXPERT = ("edp_shard", "ep")


def plan_of(
    modules: dict[str, ModulePlan],
    *,
    mesh_axes: Sequence[str] = ("dp_shard", "tp", "ep"),
    tied_pairs: Sequence[tuple[str, str]] = (),
) -> ShardingPlan:
    return ShardingPlan(modules, mesh_axes=mesh_axes, tied_pairs=tied_pairs)


def test_a_small_model() -> None:
    plan = plan_of(
        {
            "tok_embeddings": ModulePlan({"weight": {"tp": S0}}),
            "layers.0.attention": ModulePlan(
                {"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1, "dp_shard": R}}
            ),
            "layers.0.moe": ModulePlan(
                {
                    "experts.w1": {"ep": S0, "tp": S1},
                    "router.gate.weight": {"ep": R},
                },
                expert_parallel=True,
            ),
            "": ModulePlan({"norm.weight": {}}),
            "output": ModulePlan({"weight": {"tp": S0}}),
        },
        mesh_axes=("dp_shard", "edp_shard", "tp", "ep"),
        tied_pairs=[("tok_embeddings.weight", "output.weight")],
    )
    table = build_table(plan, DENSE, expert_axes=EXPERT)
    assert str(table) == (
        "tok_embeddings.weight            dense[tp=S(0)]\n"
        "layers.0.attention.wq.weight     dense[tp=S(0)]\n"
        "layers.0.attention.wo.weight     dense[tp=S(1)]\n"
        "layers.0.moe.experts.w1          expert[ep=S(0)]\n"
        "layers.0.moe.router.gate.weight  dense[tp=R]\n"
        "norm.weight                      dense[tp=R]\n"
        "output.weight                    dense[tp=S(0)]\n"
        "tied: output.weight, tok_embeddings.weight"
    )


def test_the_root_module_gives_bare_parameter_names() -> None:
    table = build_table(plan_of({"": ModulePlan({"weight": {"tp": S0}, "emb.bias": {}})}), DENSE)
    assert list(table) == ["weight", "emb.bias"]


def test_an_expert_parallel_module_routes_shards_on_ep_to_the_expert_mesh() -> None:
    plan = plan_of(
        {
            "moe": ModulePlan(
                {"experts.w1": {"ep": S0}, "experts.w2": {"ep": S1, "tp": S0}, "gate": {"ep": R}},
                expert_parallel=True,
            ),
            "mlp": ModulePlan({"experts.w1": {"ep": S0, "tp": S1}}),
        },
        mesh_axes=("dp_shard", "tp", "ep", "edp_shard"),
    )
    table = build_table(plan, ["dp_shard", "tp", "ep"], expert_axes=["edp_shard", "tp", "ep"])
    assert dict(table) == {
        "moe.experts.w1": expert(tp=R, ep=S0),
        "moe.experts.w2": expert(tp=S0, ep=S1),
        "moe.gate": dense(tp=R, ep=R),
        # no expert_parallel: stays dense whatever its path says
        "mlp.experts.w1": dense(tp=S1, ep=S0),
    }


def test_routed_experts_need_an_expert_mesh() -> None:
    plan = plan_of({"layers.1.moe": ModulePlan({"experts.w1": {"ep": S0}}, expert_parallel=True)})
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    (problem,) = info.value.problems
    assert type(problem) is LayoutError
    assert str(problem) == (
        "layers.1.moe.experts.w1: S(0) on axis 'ep' in expert-parallel module 'layers.1.moe' "
        "routes it to the expert mesh, but no expert_axes were given; pass "
        "expert_axes=(..., 'ep') or mark the module expert_parallel=False"
    )
    assert (problem.fqn, problem.axis, problem.placement) == (
        "layers.1.moe.experts.w1",
        "ep",
        "S(0)",
    )


def test_ep_on_a_dense_module_with_a_mesh_lacking_ep_is_dropped() -> None:
    plan = plan_of({"mlp": ModulePlan({"w1": {"ep": S0, "tp": S1}})})
    assert build_table(plan, DENSE)["mlp.w1"] == dense(tp=S1)


def test_an_axis_the_run_knows_but_the_mesh_lacks_is_dropped() -> None:
    plan = plan_of(
        {"m": ModulePlan({"w": {"tp": S0, "sp": S1, "etp": S0}})}, mesh_axes=("tp", "sp")
    )
    # sp: in the plan's mesh_axes; etp: an expert mesh axis; neither is on the dense mesh
    table = build_table(plan, ["tp"], expert_axes=["etp"])
    assert table["m.w"] == dense(tp=S0)


def test_an_axis_nobody_knows_is_a_typo() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"tpp": S0}})})
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    (problem,) = info.value.problems
    assert isinstance(problem, UnknownAxisError)
    assert str(problem) == (
        "m.w: S(0) on axis 'tpp', which the dense mesh (source axes ['tp']) does not have "
        "and the run does not know; fix the axis name, or add it to the plan's mesh_axes if "
        "this run has it"
    )


def test_replicate_on_an_owned_axis_builds() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"dp_shard": R, "cp": R, "tp": S0}})})
    assert build_table(plan, DENSE)["m.w"] == dense(tp=S0)


def test_an_owned_axis_is_checked_even_when_no_mesh_has_it() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"pp": S0}})})
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    assert [type(p) for p in info.value.problems] == [OwnedAxisError]


def test_every_problem_of_a_plan_is_reported_at_once() -> None:
    plan = plan_of(
        {
            "layers.0.attn": ModulePlan(
                {
                    "wq.weight": {"tp": S0, "dp_shard": S0},
                    "wk.weight": {"tp": S0},
                    "wo.weight": {"cp": Partial(), "tpp": S1},
                }
            ),
            "layers.0.moe": ModulePlan(
                {"experts.w1": {"ep": S0}, "gate.weight": {"tp": Partial()}},
                expert_parallel=True,
            ),
            "layers.1.attn": ModulePlan({"wq.weight": {"fsdp_shard": S1}}),
        }
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    e = info.value
    assert [(type(p).__name__, p.fqn, p.axis, p.placement) for p in e.problems] == [
        ("OwnedAxisError", "layers.0.attn.wq.weight", "dp_shard", "S(0)"),
        ("OwnedAxisError", "layers.0.attn.wo.weight", "cp", "P(sum)"),
        ("UnknownAxisError", "layers.0.attn.wo.weight", "tpp", "S(1)"),
        ("LayoutError", "layers.0.moe.experts.w1", "ep", "S(0)"),
        ("LayoutError", "layers.0.moe.gate.weight", "tp", "P(sum)"),
        ("OwnedAxisError", "layers.1.attn.wq.weight", "fsdp_shard", "S(1)"),
    ]
    lines = str(e).splitlines()
    assert lines[0] == "the plan has 6 problems:"
    assert lines[1:] == [f"  - {p.message}" for p in e.problems]
    assert (e.fqn, e.axis, e.placement) == ("layers.0.attn.wq.weight", "dp_shard", "S(0)")


def test_a_long_list_of_problems_is_cut_in_the_message_but_kept_whole() -> None:
    plan = plan_of({"": ModulePlan({f"w{i}": {"dp": S0} for i in range(60)})})
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    assert len(info.value.problems) == 60
    lines = str(info.value).splitlines()
    assert lines[0] == "the plan has 60 problems:"
    assert len(lines) == 1 + 50 + 1
    assert lines[-1] == "  ... and 10 more (see .problems)"


def test_one_problem_is_singular() -> None:
    plan = plan_of({"": ModulePlan({"w": {"dp": S0}})})
    with pytest.raises(PlanError, match=r"^the plan has 1 problem:\n  - w: S\(0\) on axis 'dp'"):
        build_table(plan, DENSE)


def test_partial_is_rejected_when_the_table_is_built() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"tp": Partial("max")}})})
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    (problem,) = info.value.problems
    assert str(problem) == (
        "m.w: P(max) on axis 'tp' in dense[tp=P(max)]: a parameter cannot be a pending "
        "reduction; declare R or "
        "S(dim) on that axis"
    )


def test_a_plan_whose_only_axis_is_owned_gives_empty_layouts() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"cp": R}, "b": {}})}, mesh_axes=("cp",))
    table = build_table(plan, ["cp"])
    assert dict(table) == {"m.w": dense(), "m.b": dense()}
    assert table["m.w"].placements == ()


def test_build_table_merges_the_plans_tied_pairs() -> None:
    plan = plan_of(
        {"emb": ModulePlan({"weight": {"tp": S0}}), "head": ModulePlan({"weight": {}})},
        tied_pairs=[("head.weight", "emb.weight"), ("absent.a", "absent.b")],
    )
    table = build_table(plan, DENSE)
    assert table["head.weight"] == dense(tp=S0)
    assert table.tied == (frozenset({"emb.weight", "head.weight"}),)


def test_explicit_tied_pairs_replace_the_plans() -> None:
    plan = plan_of(
        {"emb": ModulePlan({"weight": {"tp": S0}}), "head": ModulePlan({"weight": {}})},
        tied_pairs=[("head.weight", "emb.weight")],
    )
    off = build_table(plan, DENSE, tied_pairs=())
    assert off["head.weight"] == dense(tp=R)
    assert off.tied == ()
    other = build_table(plan, DENSE, tied_pairs=[("emb.weight", "lm_head.weight")])
    assert other["lm_head.weight"] == dense(tp=S0)
    assert other["head.weight"] == dense(tp=R)


def test_a_tied_conflict_is_one_of_the_plans_problems() -> None:
    plan = plan_of(
        {
            "emb": ModulePlan({"weight": {"tp": S0}}),
            "head": ModulePlan({"weight": {"tp": S1}}),
            "x": ModulePlan({"w": {"dp": S0}}),
        },
        tied_pairs=[("head.weight", "emb.weight")],
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE)
    owned, tied = info.value.problems
    assert isinstance(owned, OwnedAxisError)
    assert isinstance(tied, TiedLayoutConflict)
    assert tied.group == ("emb.weight", "head.weight")
    assert (tied.axis, tied.placements, tied.sources) == (
        "tp",
        ("S(0)", "S(1)"),
        ("emb.weight", "head.weight"),
    )


def test_a_parameter_declared_twice_must_agree() -> None:
    agree = plan_of({"a": ModulePlan({"b.w": {"tp": S0}}), "a.b": ModulePlan({"w": {"tp": S0}})})
    assert dict(build_table(agree, DENSE)) == {"a.b.w": dense(tp=S0)}
    disagree = plan_of({"a": ModulePlan({"b.w": {"tp": S0}}), "a.b": ModulePlan({"w": {"tp": S1}})})
    with pytest.raises(PlanError) as info:
        build_table(disagree, DENSE)
    (problem,) = info.value.problems
    assert str(problem).startswith("a.b.w: declared twice, as dense[tp=S(0)] and as dense[tp=S(1)]")


def test_build_table_checks_its_meshes() -> None:
    plan = plan_of({})
    with pytest.raises(LayoutError) as info:
        build_table(plan, ["tp", "tp"])
    assert info.value.axis == "tp" and "dense" in info.value.message
    with pytest.raises(LayoutError) as info:
        build_table(plan, ["tp"], expert_axes=["ep", "ep"])
    assert info.value.axis == "ep" and "expert" in info.value.message


def test_build_table_uses_the_owned_axes_it_is_given() -> None:
    plan = plan_of({"m": ModulePlan({"w": {"tp": R, "dp": S1}})}, mesh_axes=("tp", "dp"))
    assert build_table(plan, ["tp", "dp"], owned=["tp"])["m.w"] == dense(dp=S1)
    with pytest.raises(PlanError) as info:
        build_table(plan, ["tp", "dp"])
    (problem,) = info.value.problems
    assert isinstance(problem, OwnedAxisError)
    assert (problem.fqn, problem.axis, problem.placement) == ("m.w", "dp", "S(1)")


def _misspelt_mesh_axes(
    resolved: Sequence[tuple[SourceLayout, NamedPlacements]],
    dense_axes: Sequence[str],
    expert_axes: Sequence[str] | None,
    vocabulary: set[str],
) -> set[tuple[str, str | None, str | None]]:
    """A mesh's source axes no resolved parameter shards, when placements were dropped on
    axes that mesh lacks: ``build_table`` reports each as a likely misspelling."""
    out: set[tuple[str, str | None, str | None]] = set()
    for role, axes in (("dense", dense_axes), ("expert", expert_axes)):
        if axes is None:
            continue
        lacking = vocabulary - set(axes) - FSDP_OWNED_AXES
        mine = [(layout, named) for layout, named in resolved if layout.mesh == role]
        dropped = any(
            axis in lacking and not isinstance(p, Replicate)
            for _, named in mine
            for axis, p in named.items()
        )
        sharded = {
            a.name
            for layout, _ in mine
            for a, p in zip(layout.axes, layout.placements, strict=True)
            if not isinstance(p, Replicate)
        }
        if dropped:
            out |= {("LayoutError", None, a.name) for a in strip(axes) if a.name not in sharded}
    return out


def _one_step_at_a_time(
    plan: ShardingPlan,
    dense_axes: Sequence[str],
    expert_axes: Sequence[str] | None,
) -> tuple[ParamLayoutTable | None, set[tuple[str, str | None, str | None]], object]:
    """``build_table`` from the single steps: route, ``resolve``, check, ``merge_tied``.

    Returns the table (``None`` on any problem), each parameter's first problem as
    ``(kind, fqn, axis)`` and what the first tied conflict says (``None`` if there is none).
    """
    vocabulary = {a.name for a in plan.mesh_axes} | set(dense_axes) | FSDP_OWNED_AXES
    vocabulary |= set(expert_axes or ())
    entries: dict[str, SourceLayout] = {}
    resolved: list[tuple[SourceLayout, NamedPlacements]] = []
    problems: set[tuple[str, str | None, str | None]] = set()
    for fqn, spec, named in plan.named_placements():
        routed = spec.expert_parallel and isinstance(named.get("ep"), Shard)
        if routed and expert_axes is None:
            problems.add(("LayoutError", fqn, "ep"))
            continue
        try:
            layout = resolve(
                named,
                expert_axes if routed and expert_axes is not None else dense_axes,
                mesh="expert" if routed else "dense",
                fqn=fqn,
                inactive=vocabulary,
            )
            ParamLayoutTable({fqn: layout})  # rejects Partial
        except LayoutError as e:
            problems.add((type(e).__name__, e.fqn, e.axis))
            continue
        resolved.append((layout, named))
        if entries.setdefault(fqn, layout) != layout:
            problems.add(("LayoutError", fqn, None))
    problems |= _misspelt_mesh_axes(resolved, dense_axes, expert_axes, vocabulary)
    table: ParamLayoutTable | None = None
    conflict: object = None
    try:
        table = merge_tied(ParamLayoutTable(entries), plan.tied_pairs)
    except TiedLayoutConflict as e:
        conflict = (e.group, e.axis, e.placements, e.sources)
    return (None if problems else table), problems, conflict


def _check_against_the_steps(
    plan: ShardingPlan, meshes: tuple[tuple[str, ...], tuple[str, ...] | None]
) -> bool:
    dense_axes, expert_axes = meshes
    table, problems, conflict = _one_step_at_a_time(plan, dense_axes, expert_axes)
    try:
        built = build_table(plan, dense_axes, expert_axes=expert_axes)
    except PlanError as e:
        assert table is None
        found = [p for p in e.problems if not isinstance(p, TiedLayoutConflict)]
        conflicts = [p for p in e.problems if isinstance(p, TiedLayoutConflict)]
        assert problems <= {(type(p).__name__, p.fqn, p.axis) for p in found}
        assert {fqn for _, fqn, _ in problems} == {p.fqn for p in found}
        first = conflicts[0] if conflicts else None
        assert conflict == (
            None if first is None else (first.group, first.axis, first.placements, first.sources)
        )
        return False
    assert table is not None
    assert list(built.items()) == list(table.items())
    assert built.tied == table.tied
    assert built == table
    return True


@given(sharding_plans(), st.data())
def test_build_table_is_the_composition_of_the_steps(
    plan: ShardingPlan, data: st.DataObject
) -> None:
    dense_axes, expert_axes = data.draw(build_meshes(plan))
    _check_against_the_steps(plan, (dense_axes, expert_axes))
    _check_against_the_steps(plan, (dense_axes, expert_axes or ()))
    # The strategy's promise: on meshes with all the plan's axes, its plans always build.
    every = tuple(a.name for a in plan.mesh_axes)
    assert _check_against_the_steps(plan, (every, every))


@given(wild_plans() | tied_plans(), st.data())
def test_build_table_fails_exactly_when_a_step_fails(
    plan: ShardingPlan, data: st.DataObject
) -> None:
    _check_against_the_steps(plan, data.draw(build_meshes(plan)))


@given(sharding_plans(), st.data())
def test_a_built_table_keeps_plan_order_and_its_invariants(
    plan: ShardingPlan, data: st.DataObject
) -> None:
    dense_axes, expert_axes = data.draw(build_meshes(plan))
    try:
        table = build_table(plan, dense_axes, expert_axes=expert_axes or ())
    except PlanError as e:  # only when a mesh axis looks like a misspelling of a dropped one
        assert all(p.fqn is None and "did you mean" in p.message for p in e.problems)
        return
    fqns = [fqn for fqn, _, _ in plan.named_placements()]
    assert list(table)[: len(fqns)] == fqns
    for fqn in list(table)[len(fqns) :]:
        assert len(table.group_of(fqn)) > 1
    for layout in table.values():
        mesh_axes = (expert_axes or ()) if layout.mesh == "expert" else dense_axes
        assert layout.axes == strip(mesh_axes)


# --- diff -------------------------------------------------------------------------------------


def test_diff_reports_one_line_per_fqn() -> None:
    old = ParamLayoutTable(
        {"layers.3.wq.weight": dense(tp=S0), "gone": dense(tp=R), "same": dense(tp=R)}
    )
    new = ParamLayoutTable(
        {"layers.3.wq.weight": dense(tp=S1), "same": dense(tp=R), "new": expert(ep=S0)}
    )
    d = diff(old, new)
    assert dict(d.changed) == {"layers.3.wq.weight": (dense(tp=S0), dense(tp=S1))}
    assert dict(d.added) == {"new": expert(ep=S0)}
    assert dict(d.removed) == {"gone": dense(tp=R)}
    assert str(d) == (
        "layers.3.wq.weight: dense[tp=S(0)] -> dense[tp=S(1)]\n"
        "new: (absent) -> expert[ep=S(0)]\n"
        "gone: dense[tp=R] -> (absent)"
    )
    assert d


def test_diff_reports_tied_groups() -> None:
    old = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=S0)})
    new = ParamLayoutTable({"a": dense(tp=S0), "b": dense(tp=S0)}, tied=[{"a", "b"}])
    d = diff(old, new)
    assert d.tied_added == (frozenset("ab"),)
    assert str(d) == "tied +: a, b"
    assert str(diff(new, old)) == "tied -: a, b"


def test_no_differences() -> None:
    table = ParamLayoutTable({"a": dense(tp=S0)})
    d = diff(table, ParamLayoutTable({"a": dense(tp=S0)}))
    assert not d
    assert str(d) == "(no differences)"
    assert d == TableDiff(added={}, removed={}, changed={})


@given(tables())
def test_a_table_does_not_differ_from_itself(table: ParamLayoutTable) -> None:
    d = diff(table, table)
    assert not d
    assert not (d.added or d.removed or d.changed or d.tied_added or d.tied_removed)


@given(table_pairs())
def test_diff_is_antisymmetric(pair: tuple[ParamLayoutTable, ParamLayoutTable]) -> None:
    a, b = pair
    forward, backward = diff(a, b), diff(b, a)
    assert dict(forward.added) == dict(backward.removed)
    assert dict(forward.removed) == dict(backward.added)
    assert {fqn: (new, old) for fqn, (old, new) in forward.changed.items()} == dict(
        backward.changed
    )
    assert set(forward.tied_added) == set(backward.tied_removed)
    assert bool(forward) == bool(backward) == (a != b)


@given(table_pairs())
def test_diff_prints_one_line_per_change(pair: tuple[ParamLayoutTable, ParamLayoutTable]) -> None:
    a, b = pair
    d = diff(a, b)
    lines = str(d).splitlines()
    if not d:
        assert lines == ["(no differences)"]
        return
    fqns = [*d.changed, *d.added, *d.removed]
    assert len(lines) == len(fqns) + len(d.tied_added) + len(d.tied_removed)
    for fqn, line in zip(fqns, lines, strict=False):
        assert line.startswith(f"{fqn}: ")
        assert " -> " in line
    assert set(d.changed) | set(d.added) | set(d.removed) == {
        fqn for fqn in {*a, *b} if a.get(fqn) != b.get(fqn)
    }


# --- plans by pattern -------------------------------------------------------------------

LLAMA_FQNS = [
    "tok_embeddings.weight",
    *(
        f"layers.{i}.{p}"
        for i in range(3)
        for p in (
            "attention.wq.weight",
            "attention.wo.weight",
            "attention_norm.weight",
            "feed_forward.w1.weight",
        )
    ),
    "norm.weight",
    "output.weight",
]


def test_a_pattern_plan_is_resolved_against_the_model_fqns() -> None:
    plan = plan_of(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1}}),
            "layers.*": ModulePlan({"feed_forward.*.weight": {"tp": S0}}),
            "": ModulePlan({"tok_embeddings.weight": {"tp": S0}, "output.weight": {"tp": S0}}),
        },
        tied_pairs=[("tok_embeddings.weight", "output.weight")],
    )
    assert plan.has_patterns
    table = build_table(plan, DENSE, fqns=LLAMA_FQNS)
    # In the order of fqns; unmatched FQNs are left out.
    assert list(table) == [f for f in LLAMA_FQNS if "norm" not in f]
    assert table["layers.2.attention.wq.weight"] == dense(tp=S0)
    assert table["layers.1.attention.wo.weight"] == dense(tp=S1)
    assert table["layers.0.feed_forward.w1.weight"] == dense(tp=S0)
    assert table.tied == (frozenset({"tok_embeddings.weight", "output.weight"}),)


def test_an_fqn_given_twice_to_a_pattern_plan_is_one_entry() -> None:
    plan = plan_of({"layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}})})
    once = build_table(plan, DENSE, fqns=LLAMA_FQNS)
    twice = build_table(plan, DENSE, fqns=LLAMA_FQNS + LLAMA_FQNS[::-1])
    assert twice == once
    assert list(twice) == list(once) == [f"layers.{i}.attention.wq.weight" for i in range(3)]


def test_a_pattern_plan_with_a_problem_names_every_fqn_it_concerns() -> None:
    plan = plan_of(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tpp": S1}}),
            "layers.*": ModulePlan({"feed_forward.*.weight": {"tp": S0}}),
        }
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE, fqns=LLAMA_FQNS)
    assert [p.fqn for p in info.value.problems] == [
        f"layers.{i}.attention.wo.weight" for i in range(3)
    ]


def test_the_most_specific_key_wins() -> None:
    plan = plan_of(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}, "*.weight": {"tp": S1}}),
            "layers.1.attention": ModulePlan({"wq.weight": {"tp": R}}),
        }
    )
    table = build_table(plan, DENSE, fqns=LLAMA_FQNS)
    assert table["layers.0.attention.wq.weight"] == dense(tp=S0)  # 4 literals beat 3
    assert table["layers.0.attention.wo.weight"] == dense(tp=S1)
    assert table["layers.1.attention.wq.weight"] == dense(tp=R)  # exact beats patterns


def test_equally_specific_keys_with_different_placements_are_a_problem() -> None:
    plan = plan_of(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}}),
            "*.0.attention": ModulePlan({"wq.weight": {"tp": S1}}),
            "*.1.attention": ModulePlan({"wq.weight": {"tp": S0}}),  # agrees: no problem
        }
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE, fqns=LLAMA_FQNS)
    (problem,) = info.value.problems
    assert problem.fqn == "layers.0.attention.wq.weight"
    assert "'layers.*.attention.wq.weight': {'tp': S(0)}" in problem.message
    assert "'*.0.attention.wq.weight': {'tp': S(1)}" in problem.message
    assert "2 keys match it equally specifically (4 literal segments each)" in problem.message


def test_a_key_that_matches_no_fqn_is_a_problem_naming_it() -> None:
    plan = plan_of(
        {
            "layers.*.atention": ModulePlan({"wq.weight": {"tp": S0}}),
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}}),
            "decoder": ModulePlan({"weight": {"tp": S0}}),
        }
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, DENSE, fqns=LLAMA_FQNS)
    assert [p.fqn for p in info.value.problems] == ["layers.*.atention.wq.weight", "decoder.weight"]
    assert "matches no parameter FQN of the model" in info.value.problems[0].message


def test_a_pattern_overridden_everywhere_still_matches() -> None:
    plan = plan_of(
        {
            "*": ModulePlan({"weight": {"tp": S0}}),
            "": ModulePlan({"norm.weight": {"tp": R}, "output.weight": {"tp": R}}),
            "tok_embeddings": ModulePlan({"weight": {"tp": R}}),
        }
    )
    table = build_table(plan, DENSE, fqns=LLAMA_FQNS)
    assert {str(layout) for layout in table.values()} == {"dense[tp=R]"}


def test_a_plan_with_patterns_needs_the_fqns() -> None:
    plan = plan_of({"layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}})})
    with pytest.raises(PlanError, match=r"pass them as build_table\(\.\.\., fqns=") as info:
        build_table(plan, DENSE)
    assert "'layers.*.attention.wq.weight'" in info.value.problems[0].message


def test_an_exact_plan_with_fqns_follows_their_order() -> None:
    plan = plan_of({"": ModulePlan({"output.weight": {"tp": S0}, "norm.weight": {"tp": R}})})
    assert not plan.has_patterns
    table = build_table(plan, DENSE, fqns=["norm.weight", "x.weight", "output.weight"])
    assert list(table) == ["norm.weight", "output.weight"]
    assert table == build_table(plan, DENSE)


def test_patterns_route_experts_and_check_axes_per_fqn() -> None:
    plan = plan_of(
        {"layers.*.moe": ModulePlan({"experts.w1": {"ep": S0, "tp": S1}}, expert_parallel=True)},
        mesh_axes=("dp_shard", "tp", "ep", "edp_shard"),
    )
    fqns = [f"layers.{i}.moe.experts.w1" for i in range(4)]
    table = build_table(plan, DENSE, expert_axes=("edp_shard", "ep", "tp"), fqns=fqns)
    assert all(layout == expert(ep=S0, tp=S1) for layout in table.values())
    typo = plan_of({"layers.*": ModulePlan({"w": {"tpp": S0}})})
    with pytest.raises(PlanError) as info:
        build_table(typo, DENSE, fqns=["layers.0.w", "layers.1.w"])
    assert [p.fqn for p in info.value.problems] == ["layers.0.w", "layers.1.w"]


@pytest.mark.parametrize("key", ["layers.a*.w", "layers.**", "*.", ".*", "a..b"])
def test_a_star_is_a_whole_segment(key: str) -> None:
    with pytest.raises(LayoutError, match="a segment may be '\\*'"):
        ModulePlan({key: {}})
    with pytest.raises(LayoutError, match="a segment may be '\\*'"):
        ShardingPlan({key: ModulePlan({})}, mesh_axes=["tp"])


def test_fqns_are_checked() -> None:
    plan = plan_of({"layers.*": ModulePlan({"w": {"tp": S0}})})
    with pytest.raises(LayoutError, match="fqns must be a collection"):
        build_table(plan, DENSE, fqns="layers.0.w")
    with pytest.raises(LayoutError, match="fqns: a parameter FQN must be a non-empty string"):
        build_table(plan, DENSE, fqns=["layers.0.w", 3])  # type: ignore[list-item]


_SEGMENTS = st.sampled_from(["layers", "0", "1", "attn", "mlp", "w", "b"])


def _brute_force(keys: list[str], fqn: str) -> list[str]:
    """The most specific keys matching ``fqn``, by one regex per key (the slow way)."""
    matching = [
        k
        for k in keys
        if re.fullmatch(
            r"\.".join("[^.]+" if s == "*" else re.escape(s) for s in k.split(".")), fqn
        )
    ]
    if not matching:
        return []
    top = max(sum(s != "*" for s in k.split(".")) for k in matching)
    return [k for k in matching if sum(s != "*" for s in k.split(".")) == top]


_WORDS = st.sampled_from(["layers", "attn", "mlp", "w", "b"])
_NUMBERED = st.sampled_from(["layers", "attn", "w", "0", "1", "12", "w1", "w2", "a#", "a3"])


def _keys_and_fqns(
    key_segments: st.SearchStrategy[str], fqn_segments: st.SearchStrategy[str], max_fqns: int
) -> tuple[st.SearchStrategy[list[str]], st.SearchStrategy[list[str]]]:
    """Plan keys of ``key_segments`` and ``*``, and FQNs of ``fqn_segments``."""

    def dotted(segments: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.lists(segments, min_size=1, max_size=4).map(".".join)

    keys = st.lists(dotted(key_segments | st.just("*")), min_size=1, max_size=8, unique=True)
    return keys, st.lists(dotted(fqn_segments), max_size=max_fqns, unique=True)


@given(*_keys_and_fqns(_WORDS, _NUMBERED, 30))
@example(keys=["layers.*.w", "a#"], fqns=["layers.1.w", "layers.12.w", "a3", "a#", "layers.a#.w"])
def test_pattern_matching_of_numbered_fqns_agrees_with_one_regex_per_key(
    keys: list[str], fqns: list[str]
) -> None:
    # Keys of words, FQNs of numbered layers and names that differ only in digits.
    _agrees_with_one_regex_per_key(keys, fqns)


@given(*_keys_and_fqns(_SEGMENTS, _SEGMENTS, 20))
@example(keys=["layers.0.w", "layers.*.w"], fqns=["layers.0.w", "layers.1.w", "layers.10.w"])
@example(keys=["1", "*"], fqns=["0", "1"])
@example(keys=["w", "a.*.w", "a.b"], fqns=["w", "a.b", "a.1.w", "a.w.w", "a.b.w"])
def test_pattern_matching_agrees_with_one_regex_per_key(keys: list[str], fqns: list[str]) -> None:
    _agrees_with_one_regex_per_key(keys, fqns)


def _agrees_with_one_regex_per_key(keys: list[str], fqns: list[str]) -> None:
    # Each key gets its own placement (its index as a dim), so every tie is a conflict.
    plan = ShardingPlan(
        {"": ModulePlan({k: {"tp": Shard(i)} for i, k in enumerate(keys)})}, mesh_axes=["tp"]
    )
    expected = {f: _brute_force(keys, f) for f in fqns}
    unused = [k for k in keys if not any(_brute_force([k], f) for f in fqns)]
    try:
        table = build_table(plan, ["tp"], fqns=fqns)
    except PlanError as e:
        ties = {p.fqn for p in e.problems if "equally specifically" in p.message}
        assert [p.fqn for p in e.problems if "matches no parameter" in p.message] == unused
        # A tie is reported once per set of keys, at its first FQN.
        assert ties <= {f for f, best in expected.items() if len(best) > 1}
        assert bool(ties) == any(len(best) > 1 for best in expected.values())
        return
    assert not unused
    assert list(table) == [f for f in fqns if expected[f]]
    for fqn, layout in table.items():
        (key,) = expected[fqn]
        assert layout.placements == (Shard(keys.index(key)),)


def _reference(keys: list[str], fqns: list[str]) -> tuple[list[tuple[int, ...]], list[int]]:
    """Every key against every FQN, plainly: for each FQN the indices of the matching
    keys with the most literal segments, and the indices of the keys matching none."""
    answers: list[tuple[int, ...]] = []
    used: set[int] = set()
    for fqn in fqns:
        segments = fqn.split(".")
        matching = []
        for i, key in enumerate(keys):
            parts = key.split(".")
            if len(parts) == len(segments) and all(
                p in ("*", s) for p, s in zip(parts, segments, strict=True)
            ):
                matching.append(i)
        used.update(matching)
        literals = {i: sum(p != "*" for p in keys[i].split(".")) for i in matching}
        top = max(literals.values(), default=0)
        answers.append(tuple(i for i in matching if literals[i] == top))
    return answers, [i for i in range(len(keys)) if i not in used]


_KEY_SEGMENTS = st.sampled_from(["layers", "experts", "0", "1", "w", "b", "*", "*"])


@given(
    st.lists(st.lists(_KEY_SEGMENTS, min_size=1, max_size=5).map(".".join), max_size=12),
    st.lists(st.lists(_SEGMENTS | st.just("experts"), min_size=1, max_size=5), max_size=30),
    st.booleans(),
)
@example(keys=["a.*", "a.*", "*.b", "a.b"], fqns=[["a", "b"], ["a", "c"], ["c", "b"]], one=False)
@example(keys=[f"experts.{i}.*" for i in range(3)], fqns=[["experts", "1", "w"]] * 2, one=True)
def test_the_indexed_matcher_agrees_with_every_key_against_every_fqn(
    keys: list[str], fqns: list[list[str]], one: bool
) -> None:
    names = [".".join(f) for f in fqns]
    expected, unused = _reference(keys, names)
    matcher = Matcher(Rule(k, i) for i, k in enumerate(keys))  # a key may be given twice
    found = [matcher.match(n) for n in names] if one else matcher.match_all(names)
    assert found == expected
    assert [r.value for r in matcher.unused()] == unused
    assert set(found) <= matcher.answers()


def test_ten_thousand_pattern_keys_over_forty_thousand_fqns() -> None:
    # Each key names its own expert: the keys are indexed, not each tried on each FQN.
    n = 10_000
    fqns = [f"experts.{i}.w{j}.weight" for i in range(n) for j in range(4)]
    by_module = plan_of(
        {f"experts.{i}.*": ModulePlan({"weight": {"tp": Shard(i % 2)}}) for i in range(n)}
    )
    by_path = plan_of(
        {"experts": ModulePlan({f"{i}.*.weight": {"tp": Shard(i % 2)} for i in range(n)})}
    )
    for plan in (by_module, by_path):
        table = build_table(plan, DENSE, fqns=fqns)
        assert list(table) == fqns
        assert table["experts.9998.w3.weight"] == dense(tp=S0)
        assert table["experts.9999.w0.weight"] == dense(tp=S1)
    unmatched = plan_of({f"experts.{i}.*": ModulePlan({"bias": {}}) for i in range(n)})
    with pytest.raises(PlanError) as info:
        build_table(unmatched, DENSE, fqns=fqns)
    assert len(info.value.problems) == n
    assert info.value.problems[-1].fqn == "experts.9999.*.bias"


# --- the table of a plan by pattern ------------------------------------------------------


def _layered(layers: str) -> dict[str, ModulePlan]:
    """A MoE model's plan, its layers' modules under ``layers`` (``*`` or one number)."""
    return {
        "emb": ModulePlan({"weight": {"tp": S0}}),
        f"layers.{layers}.attn": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1}}),
        f"layers.{layers}.moe": ModulePlan(
            {"experts.w1": {"ep": S0, "tp": S1}, "router.gate.weight": {}}, expert_parallel=True
        ),
        "head": ModulePlan({"weight": {"tp": Replicate()}}),
    }


_LAYER_PARAMS = (
    "attn.wq.weight",
    "attn.wo.weight",
    "attn_norm.weight",  # no key matches it: left out
    "moe.experts.w1",
    "moe.router.gate.weight",
)


@given(
    layers=st.integers(1, 6),
    order=st.randoms(use_true_random=False),
    tied=st.booleans(),
    lookups=st.lists(
        st.sampled_from(["layers.0.attn.wq.weight", "head.weight", "emb", "x", "layers.9.w"])
        | st.text(max_size=6),
        max_size=16,
    ),
)
def test_a_pattern_plans_table_reads_as_the_table_spelled_out(
    layers: int, order: random.Random, tied: bool, lookups: list[str]
) -> None:
    pairs = [("emb.weight", "head.weight")] if tied else []
    plan = ShardingPlan(_layered("*"), mesh_axes=["ep", "tp"], tied_pairs=pairs)
    spelled_modules: dict[str, ModulePlan] = {}
    for i in range(layers):
        spelled_modules.update(_layered(str(i)))
    spelled_plan = ShardingPlan(spelled_modules, mesh_axes=["ep", "tp"], tied_pairs=pairs)
    fqns = ["emb.weight", "head.weight"]
    fqns += [f"layers.{i}.{p}" for i in range(layers) for p in _LAYER_PARAMS]
    order.shuffle(fqns)
    table = build_table(plan, ["tp"], expert_axes=["ep", "tp"], fqns=fqns)
    by_fqn = build_table(spelled_plan, ["tp"], expert_axes=["ep", "tp"])
    # tied, the head's R becomes the embedding's S(0): in its place
    assert list(table) == [f for f in fqns if "norm" not in f]
    expected = ParamLayoutTable({f: by_fqn[f] for f in table}, tied=by_fqn.tied)
    for key in lookups:  # each answers as a dict does
        assert table.get(key) == expected.get(key)
        assert (key in table) == (key in expected)
        if key not in expected:
            with pytest.raises(KeyError):
                table[key]
    assert 1 not in table  # type: ignore[comparison-overlap]
    assert [] not in table  # type: ignore[comparison-overlap]  # no FQN is anything but text
    _reads_as(table, expected)
    assert table == by_fqn and dict(table.items()) == dict(by_fqn.items())
    assert (table == dict(table.items())) == (not table.tied)  # a mapping has no tied groups
    assert not diff(table, by_fqn)
    # composed with FSDP
    sizes = {"dense": {"dp_shard": 2, "tp": 2}, "expert": {"dp_shard": 1, "ep": 2, "tp": 2}}
    fsdp = {"dense": "dp_shard", "expert": "dp_shard"}
    composed = compose_table(table, fsdp=fsdp, mesh_sizes=sizes)
    _reads_as(composed, compose_table(expected, fsdp=fsdp, mesh_sizes=sizes))


@pytest.mark.parametrize("norms", [1, 16])
def test_tied_members_of_a_pattern_plans_table_change_in_place_or_come_last(norms: int) -> None:
    # Each norm is tied to a layer's weight (its R becomes S(0)), and the first layer's to
    # a weight no key names (given the group's layout, after the others).
    fqns = [f"layers.{i}.w.weight" for i in range(norms)]
    fqns += [f"layers.{i}.norm.weight" for i in range(norms)]
    pairs = [(f"layers.{i}.w.weight", f"layers.{i}.norm.weight") for i in range(norms)]
    pairs.append(("layers.0.w.weight", "extra.weight"))

    def plan(layers: str) -> dict[str, ModulePlan]:
        return {
            f"layers.{layers}.w": ModulePlan({"weight": {"tp": S0}}),
            f"layers.{layers}.norm": ModulePlan({"weight": {"tp": Replicate()}}),
        }

    by_pattern = ShardingPlan(plan("*"), mesh_axes=["tp"], tied_pairs=pairs)
    table = build_table(by_pattern, ["tp"], fqns=fqns)
    spelled = {k: v for i in range(norms) for k, v in plan(str(i)).items()}
    expected = build_table(ShardingPlan(spelled, mesh_axes=["tp"], tied_pairs=pairs), ["tp"])
    assert list(table) == [*fqns, "extra.weight"]
    assert set(table.values()) == {SourceLayout("dense", ("tp",), (S0,))}
    assert table == expected and table.tied == expected.tied


# --- plain parameters -------------------------------------------------------------------

PLAIN = SourceLayout("dense", (), ())


def test_complete_default_can_leave_parameters_plain() -> None:
    table = ParamLayoutTable({"w": dense(tp=S0)})
    done = complete_default(table, ["w", "norm.weight"], DENSE, plain=True)
    assert done["w"] == dense(tp=S0)
    assert done["norm.weight"] == PLAIN
    assert str(done["norm.weight"]) == "dense[]"
    # A mesh of owned axes only is fine for plain parameters.
    assert complete_default(table, ["b"], ["dp_shard"], plain=True)["b"] == PLAIN
    with pytest.raises(LayoutError, match="plain must be True or False"):
        complete_default(table, ["b"], DENSE, plain="yes")  # type: ignore[arg-type]


def test_a_plain_member_of_a_tied_group_takes_the_other_layout() -> None:
    table = ParamLayoutTable({"emb.weight": PLAIN, "head.weight": dense(tp=S0)})
    for pairs in ([("emb.weight", "head.weight")], [("head.weight", "emb.weight")]):
        merged = merge_tied(table, pairs)
        assert merged["emb.weight"] == merged["head.weight"] == dense(tp=S0)
    both_plain = ParamLayoutTable({"a": PLAIN, "b": PLAIN})
    assert merge_tied(both_plain, [("a", "b")])["a"] == PLAIN
    other_role = ParamLayoutTable({"a": PLAIN, "b": expert(ep=S0)})
    with pytest.raises(TiedLayoutConflict, match="one mesh with the same axes"):
        merge_tied(other_role, [("a", "b")])


def test_complete_default_closes_tied_pairs_over_the_completed_table() -> None:
    # build_table keeps no group with no member in its table: a tie between two
    # parameters the plan left plain comes back when the table is completed.
    plan = ShardingPlan(
        {"layers.0.wq": ModulePlan({"weight": {"tp": S0}})},
        mesh_axes=DENSE,
        tied_pairs=[("emb.weight", "head.weight")],
    )
    built = build_table(plan, DENSE)
    assert built.tied == ()
    fqns = ["emb.weight", "layers.0.wq.weight", "head.weight"]
    done = complete_default(built, fqns, DENSE, plain=True, tied_pairs=plan.tied_pairs)
    assert done.tied == (frozenset({"emb.weight", "head.weight"}),)
    assert done["emb.weight"] == done["head.weight"] == PLAIN
    assert complete_default(built, fqns, DENSE, plain=True).tied == ()
    # Completed members take their group's layout; a conflict is explained.
    sharded = ParamLayoutTable({"head.weight": dense(tp=S0)})
    tied = complete_default(
        sharded, ["emb.weight"], DENSE, tied_pairs=[("emb.weight", "head.weight")]
    )
    assert tied["emb.weight"] == dense(tp=S0)
    with pytest.raises(LayoutError, match="tied_pairs"):
        complete_default(sharded, ["emb.weight"], DENSE, tied_pairs="ab")


# --- the table of a plan of a few module sorts --------------------------------------------


def _reads_as(table: ParamLayoutTable, expected: ParamLayoutTable) -> None:
    """``table`` reads in every way as ``expected``."""
    assert table == expected
    assert hash(table) == hash(expected)
    assert list(table.items()) == list(expected.items())
    assert list(table.values()) == list(expected.values())
    assert len(table) == len(expected)
    assert repr(table) == repr(expected)
    assert str(table) == str(expected)
    assert table.tied == expected.tied
    for fqn, layout in expected.items():
        assert table[fqn] == layout
        assert fqn in table
        assert table.get(fqn) == layout
    for protocol in range(6):
        assert pickle.loads(pickle.dumps(table, protocol)) == expected


def _moe_plan(layers: int) -> ShardingPlan:
    modules = {"emb": ModulePlan({"weight": {"tp": Shard(0)}})}
    for i in range(layers):
        modules[f"layers.{i}.attn"] = ModulePlan({"wq.weight": {"tp": Shard(0)}})
        modules[f"layers.{i}.moe"] = ModulePlan(
            {"experts.w1": {"ep": Shard(0), "tp": Shard(1)}, "router.gate.weight": {}},
            expert_parallel=True,
        )
    modules["head"] = ModulePlan({"weight": {"tp": Shard(0)}})
    return ShardingPlan(modules, mesh_axes=["ep", "tp"], tied_pairs=[("emb.weight", "head.weight")])


def test_a_plan_of_a_few_module_sorts_reads_as_any_table() -> None:
    plan = _moe_plan(3)
    table = build_table(plan, ["tp"], expert_axes=["ep", "tp"])
    assert list(table) == [fqn for fqn, _, _ in plan.named_placements()]
    assert table["layers.2.moe.experts.w1"] == SourceLayout(
        "expert", ("ep", "tp"), (Shard(0), Shard(1))
    )
    assert table["layers.2.moe.router.gate.weight"] == SourceLayout(
        "dense", ("tp",), (Replicate(),)
    )
    for missing in (
        "layers.2.moe",
        "layers.2.moe.experts",
        "layers.9.attn.wq.weight",
        "weight",
        "",
    ):
        assert missing not in table
        assert table.get(missing) is None
        with pytest.raises(KeyError):
            table[missing]
    assert 1 not in table  # type: ignore[comparison-overlap]
    assert [] not in table  # type: ignore[comparison-overlap]  # no FQN is anything but text
    spelled = ParamLayoutTable(dict(table.items()), tied=table.tied)
    assert table == spelled and dict(table.items()) == dict(spelled.items())
    assert (table == dict(table.items())) == (not table.tied)  # a mapping has no tied groups
    assert hash(table) == hash(spelled)
    assert diff(table, spelled).added == {}
    assert not diff(table, spelled)


def test_a_module_path_that_spells_another_modules_parameter_is_declared_once() -> None:
    clash = {
        "moe": ModulePlan({"experts.w1": {"tp": Shard(0)}}),
        "moe.experts": ModulePlan({"w1": {"tp": Shard(1)}}),
    }
    with pytest.raises(PlanError, match=r"moe\.experts\.w1: declared twice"):
        build_table(ShardingPlan(clash, mesh_axes=["tp"]), ["tp"])
    same = {
        "": ModulePlan({"moe.experts.w1": {"tp": Shard(0)}}),
        "moe": ModulePlan({"experts.w1": {"tp": Shard(0)}}),
    }
    table = build_table(ShardingPlan(same, mesh_axes=["tp"]), ["tp"])
    assert list(table) == ["moe.experts.w1"]
    assert len(table) == 1


def test_a_clash_is_found_beside_paths_whose_segments_no_module_spells() -> None:
    clash = {
        "moe": ModulePlan({"qq.w": {"tp": Shard(0)}, "experts.w1": {"tp": Shard(0)}}),
        "moe.experts": ModulePlan({"w1": {"tp": Shard(1)}}),
    }
    with pytest.raises(PlanError) as info:
        build_table(ShardingPlan(clash, mesh_axes=["tp"]), ["tp"])
    assert [p.fqn for p in info.value.problems] == ["moe.experts.w1"]
    apart = {"moe": clash["moe"], "mlp.zz": ModulePlan({"w1": {"tp": Shard(1)}})}
    table = build_table(ShardingPlan(apart, mesh_axes=["tp"]), ["tp"])
    assert list(table) == ["moe.qq.w", "moe.experts.w1", "mlp.zz.w1"]


def test_tied_members_merged_to_a_new_layout_keep_their_place() -> None:
    modules = {
        "emb": ModulePlan({"weight": {"tp": Shard(0)}}),
        "head": ModulePlan({"weight": {"tp": Replicate()}}),
    }
    plan = ShardingPlan(modules, mesh_axes=["tp"], tied_pairs=[("emb.weight", "head.weight")])
    table = build_table(plan, ["tp"])
    assert (
        table["head.weight"] == table["emb.weight"] == SourceLayout("dense", ("tp",), (Shard(0),))
    )
    assert table.tied == (frozenset({"emb.weight", "head.weight"}),)
    assert list(table) == ["emb.weight", "head.weight"]


def test_a_segment_that_only_looks_like_a_module_path_is_no_clash() -> None:
    near = {
        "moe": ModulePlan({"experts.w1": {"tp": Shard(0)}}),
        "moe.experts_gate": ModulePlan({"w1": {"tp": Shard(1)}}),
        "a.b": ModulePlan({"c.d.e": {"tp": Shard(0)}}),
    }
    table = build_table(ShardingPlan(near, mesh_axes=["tp"]), ["tp"])
    assert list(table) == ["moe.experts.w1", "moe.experts_gate.w1", "a.b.c.d.e"]
    deep = {**near, "a.b.c.d": ModulePlan({"e": {"tp": Shard(1)}})}
    with pytest.raises(PlanError) as info:
        build_table(ShardingPlan(deep, mesh_axes=["tp"]), ["tp"])
    assert [p.fqn for p in info.value.problems] == ["a.b.c.d.e"]


# --- completing and tying a built table --------------------------------------------------

_EXTRA_FQNS = (
    "layers.0.attn_norm.weight",  # a module the plan does not name
    "layers.0.attn.wq.bias",  # a module the plan names, a parameter it does not
    "layers.0.moe.experts.w2",  # under a dotted path of a named module
    "layers.0.moe.experts",  # a prefix of an entry
    "layers.0.moe",  # a module's own FQN
    "bias",  # at the root
    "emb.weight.extra",  # an entry's FQN as a prefix
)


def _built_table(kind: str, layers: int, root: str | None) -> ParamLayoutTable:
    """A table ``build_table`` made of a plan ``by_module`` (with a root module ``root``:
    ``"first"`` or ``"last"`` of the modules) or ``by_pattern``."""
    if kind == "by_pattern":
        fqns = ["emb.weight", "head.weight"]
        fqns += [f"layers.{i}.{p}" for i in range(layers) for p in _LAYER_PARAMS]
        plan = ShardingPlan(_layered("*"), mesh_axes=["ep", "tp"])
        return build_table(plan, ["tp"], expert_axes=["ep", "tp"], fqns=fqns)
    scale = {"": ModulePlan({"scale": {"tp": Replicate()}})}
    modules: dict[str, ModulePlan] = dict(scale) if root == "first" else {}
    for i in range(layers):
        modules.update(_layered(str(i)))
    if root == "last":
        modules.update(scale)
    return build_table(
        ShardingPlan(modules, mesh_axes=["ep", "tp"]), ["tp"], expert_axes=["ep", "tp"]
    )


@given(
    kind=st.sampled_from(["by_module", "by_pattern"]),
    layers=st.integers(1, 3),
    root=st.sampled_from([None, "first", "last"]),
    plain=st.booleans(),
    data=st.data(),
)
def test_completing_a_built_table_reads_as_completing_it_rebuilt_from_its_entries(
    kind: str, layers: int, root: str | None, plain: bool, data: st.DataObject
) -> None:
    table = _built_table(kind, layers, root)
    flat = ParamLayoutTable(dict(table.items()), tied=table.tied)
    names = data.draw(
        st.lists(st.sampled_from([*table, *_EXTRA_FQNS]), max_size=3 * len(table) + 8),
        label="fqns",
    )
    pairs = data.draw(
        st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)), max_size=2)
        if names
        else st.just([]),
        label="tied_pairs",
    )
    for fqns in (names, tuple(names), list(table), tuple(table)):
        try:
            expected = complete_default(flat, fqns, ["tp"], plain=plain, tied_pairs=pairs)
        except TiedLayoutConflict as e:
            with pytest.raises(TiedLayoutConflict) as raised:
                complete_default(table, fqns, ["tp"], plain=plain, tied_pairs=pairs)
            assert str(raised.value) == str(e)
            continue
        done = complete_default(table, fqns, ["tp"], plain=plain, tied_pairs=pairs)
        _reads_as(done, expected)


@given(
    kind=st.sampled_from(["by_module", "by_pattern"]),
    layers=st.integers(1, 3),
    root=st.sampled_from([None, "first", "last"]),
    data=st.data(),
)
def test_tying_a_built_table_reads_as_tying_it_rebuilt_from_its_entries(
    kind: str, layers: int, root: str | None, data: st.DataObject
) -> None:
    table = _built_table(kind, layers, root)
    fqns = [*table, *_EXTRA_FQNS[:2]]
    groups = data.draw(
        st.lists(st.tuples(st.sampled_from(fqns), st.sampled_from(fqns)), max_size=3)
    )
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(fqns), st.sampled_from(fqns)), max_size=3))
    try:
        tied = merge_tied(table, groups)
    except TiedLayoutConflict:
        return
    flat = ParamLayoutTable(dict(tied.items()), tied=tied.tied)
    try:
        expected = merge_tied(flat, pairs)
    except TiedLayoutConflict as e:
        with pytest.raises(TiedLayoutConflict) as raised:
            merge_tied(tied, pairs)
        assert str(raised.value) == str(e)
        return
    _reads_as(merge_tied(tied, pairs), expected)


def test_merge_tied_of_equal_layouts_changes_no_entry() -> None:
    for kind in ("by_module", "by_pattern"):
        table = _built_table(kind, 2, root=None)
        same = merge_tied(table, [("layers.0.attn.wq.weight", "layers.1.attn.wq.weight")])
        assert dict(same.items()) == dict(table.items()) and list(same) == list(table)
        assert same.tied == (frozenset({"layers.0.attn.wq.weight", "layers.1.attn.wq.weight"}),)
        # a member missing from the table takes its group's layout, after the others
        added = merge_tied(table, [("emb.weight", "tied.weight")])
        assert list(added)[-1] == "tied.weight"
        assert added["tied.weight"] == table["emb.weight"]


_NOT_A_TABLE = {"w": SourceLayout("dense", (), ())}


@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda: merge_tied(_NOT_A_TABLE, []), "merge_tied(table=...)"),  # type: ignore[arg-type]
        (lambda: complete_default(_NOT_A_TABLE, [], ["tp"]), "complete_default(table=...)"),  # type: ignore[arg-type]
        (lambda: diff(_NOT_A_TABLE, ParamLayoutTable({})), "diff(a=...)"),  # type: ignore[arg-type]
        (lambda: diff(ParamLayoutTable({}), _NOT_A_TABLE), "diff(b=...)"),  # type: ignore[arg-type]
        (
            lambda: compose_table(_NOT_A_TABLE, fsdp={}, mesh_sizes={}),  # type: ignore[arg-type]
            "compose_table(table=...)",
        ),
        (lambda: lint(_NOT_A_TABLE, {}, mesh_sizes={}), "lint(table=...)"),  # type: ignore[arg-type]
        (lambda: shard_dims_by_role(_NOT_A_TABLE, {}), "shard_dims_by_role(table=...)"),  # type: ignore[arg-type]
    ],
)
def test_every_function_refuses_a_non_table_in_the_same_words(
    call: Callable[[], object], arg: str
) -> None:
    """One message for "not a table": the call and argument, what was given, what to do."""
    with pytest.raises(LayoutError) as info:
        call()
    assert str(info.value) == (
        f"{arg} must be a ParamLayoutTable, got dict {_NOT_A_TABLE!r}; "
        "build one with build_table or read one with from_json"
    )
