"""plan_from_torchtitan against torchtitan 0.3's own parallelism, on the fake 8-rank world.

The oracles: torchtitan's parallelize functions for llama3, qwen3 (dense and MoE),
deepseek_v3 and gpt_oss, run on its debug models (two layers, meta device). Under its
``partial_dtensor`` and ``full_dtensor`` backends they apply tensor and expert parallelism,
then FSDP: every parameter is a DTensor, compared with ``compose_table`` of the predicted
table (FSDP's shard dims from ``shard_dims_from_torchtitan``), placements and the local
shape this rank holds. Under its default ``spmd_types`` backend a sharded parameter is a
plain tensor holding the local shard, with spmd_types' records (``_local_type``,
``_partition_spec``): compared with those records and with the local shape the predicted
layout gives. Skipped where torchtitan is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from layout_algebra import (
    LayoutError,
    Mesh,
    ParamLayoutTable,
    PlanError,
    build_table,
    complete_default,
    compose_table,
    local_shape_and_offset,
)
from layout_algebra.torch_bridge.torchtitan import (
    plan_from_torchtitan,
    shard_dims_from_torchtitan,
    state_dict_fqn,
)
from tests.torch_oracle import layout_of
from tests.torchtitan_runs import (
    Run,
    Titan,
    build,
    function,
    function_of,
    get,
    layout_record,
    module,
    spmd_groups,
    spmd_record,
)

pytestmark = [
    pytest.mark.usefixtures("fake_world"),
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


def names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters(remove_duplicate=False)]


def predicted(run: Run, model: nn.Module) -> ParamLayoutTable:
    """The package's table: the model's torchtitan sharding read, built, completed plain."""
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    dense = tuple(a for a in run.mesh_axes if a in run.dense)
    expert = ("efsdp", "ep") if run.ep > 1 else None
    fqns = [state_dict_fqn(name) for name in names(model)]
    table = build_table(plan, dense, expert_axes=expert, fqns=fqns)
    return complete_default(table, fqns, dense, plain=True, tied_pairs=plan.tied_pairs)


RUNS = [
    Run("llama3", "full_dtensor", tp=2),
    Run("qwen3", "full_dtensor", tp=2),
    Run("qwen3_moe", "full_dtensor", tp=2, ep=4),
    Run("qwen3_moe", "full_dtensor", tp=2),
    Run("deepseek_v3", "full_dtensor", tp=2, ep=8),
    Run("deepseek_v3", "full_dtensor", tp=2, ep=2, experts=4),
    Run("deepseek_v3", "full_dtensor", tp=2, experts=4),
    Run("gpt_oss", "full_dtensor", tp=2, ep=2),
    Run("llama3", "partial_dtensor", tp=4),
    Run("qwen3_moe", "partial_dtensor", tp=1, ep=4),
    Run("deepseek_v3", "partial_dtensor", tp=2, experts=4),
    Run("gpt_oss", "partial_dtensor", tp=2),
    Run("gpt_oss", "partial_dtensor", tp=2, ep=2, checkpointing=True),
    Run("deepseek_v3", "full_dtensor", tp=2, replicate=2, experts=4),
    Run("deepseek_v3", "partial_dtensor", tp=2, replicate=2, experts=4),
    Run("qwen3_moe", "partial_dtensor", tp=2, ep=2, replicate=2),
]


@pytest.mark.parametrize("run", RUNS, ids=str)
def test_plan_then_fsdp_as_torchtitan_makes_it(run: Run, titan: Titan) -> None:
    model = build(run)
    expected = predicted(run, model)
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    before = names(model)
    dims = titan.parallel_dims(run)
    shard_dims = shard_dims_from_torchtitan(model, parallel_dims=dims)
    titan.parallelize(run, model, dims)
    sizes = {"dense": run.dense, "expert": run.expert}
    composed = compose_table(
        expected,
        fsdp=run.fsdp,
        mesh_sizes=sizes,
        shard_dim=shard_dims,
    )
    after = list(model.named_parameters(remove_duplicate=False))
    assert len(after) == len(before) == len(composed)
    for fqn, (name, param) in zip(before, after, strict=True):
        assert isinstance(param, DTensor), name
        dim_names = param.device_mesh.mesh_dim_names
        assert dim_names is not None
        role = "expert" if "ep" in dim_names else "dense"
        assert layout_of(param, role) == composed[fqn], fqn
        coordinate = param.device_mesh.get_coordinate()
        assert coordinate is not None
        here = dict(zip(dim_names, coordinate, strict=True))
        local, _ = local_shape_and_offset(tuple(param.shape), composed[fqn], sizes[role], here)
        assert tuple(param.to_local().shape) == local, fqn
    # The model is only read: after torchtitan's parallelism the same plan is read.
    assert plan_from_torchtitan(model, mesh_axes=run.mesh_axes) == plan


SPMD_RUNS = [
    Run("llama3", "spmd_types", tp=2),
    Run("qwen3", "spmd_types", tp=4),
    Run("qwen3_moe", "spmd_types", tp=2, ep=4),
    Run("qwen3_moe", "spmd_types", tp=2),
    Run("deepseek_v3", "spmd_types", tp=2, ep=8),
    Run("gpt_oss", "spmd_types", tp=2, ep=2),
    Run("gpt_oss", "spmd_types", tp=2),
]


@pytest.mark.parametrize("run", SPMD_RUNS, ids=str)
def test_plan_as_spmd_types_records_it(run: Run, titan: Titan) -> None:
    """torchtitan's default backend: plain local shards, their layout in spmd records."""
    model = build(run)
    expected = predicted(run, model)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}
    dims = titan.parallel_dims(run)
    titan.parallelize(run, model, dims)
    groups = spmd_groups(dims)
    sizes = {"dense": {"tp": run.tp}, "expert": {"ep": run.ep}}
    sharded = 0
    for name, param in model.named_parameters(remove_duplicate=False):
        assert not isinstance(param, DTensor), name
        layout = expected[name]
        assert spmd_record(param, groups) == layout_record(layout, groups), name
        here = dict.fromkeys((a.name for a in layout.axes), 0)  # this process is rank 0
        local, _ = local_shape_and_offset(shapes[name], layout, sizes[layout.mesh], here)
        assert tuple(param.shape) == local, name
        sharded += local != shapes[name]
    assert sharded  # the local shapes are not the global ones


# ---------------------------------------------------------------------------------------
# what each model gets, spelled out; ties; activation checkpointing


def layouts(table: ParamLayoutTable, *fqns: str) -> dict[str, str]:
    return {fqn: str(table[fqn]) for fqn in fqns}


def test_what_the_models_get() -> None:
    """The readings the comparisons above confirm, for a reader."""
    run = Run("qwen3_moe", "spmd_types", tp=2, ep=4)
    table = predicted(run, build(run))
    block = "layers.0."
    experts = block + "moe.routed_experts.inner_experts."
    assert layouts(
        table,
        block + "attention.qkv_linear.wqkv.weight",
        block + "attention.wo.weight",
        block + "attention.q_norm.weight",
        block + "moe.router.gate.weight",
        experts + "w1_EFD",
        experts + "w2_EDF",
        "norm.weight",
    ) == {
        block + "attention.qkv_linear.wqkv.weight": "dense[tp=S(0)]",
        block + "attention.wo.weight": "dense[tp=S(1)]",
        # norms and the router: declared on tp, whole (replicated DTensors)
        block + "attention.q_norm.weight": "dense[tp=R]",
        block + "moe.router.gate.weight": "dense[tp=R]",
        # whole experts per ep rank
        experts + "w1_EFD": "expert[ep=S(0)]",
        experts + "w2_EDF": "expert[ep=S(0)]",
        "norm.weight": "dense[tp=R]",
    }
    # Without expert parallelism torchtitan shards each expert over tp instead.
    run = Run("qwen3_moe", "spmd_types", tp=2)
    table = predicted(run, build(run))
    assert layouts(table, experts + "w1_EFD", experts + "w2_EDF") == {
        experts + "w1_EFD": "dense[tp=S(1)]",
        experts + "w2_EDF": "dense[tp=S(2)]",
    }


@pytest.mark.filterwarnings("ignore:DTensor random operators may not have complete support")
def test_tied_embedding_is_tied_again_by_torchtitan(titan: Titan) -> None:
    """qwen3's debug model ties its embedding to its head: parallelizing gives each module a
    parameter of its own, and torchtitan's ``init_weights`` ties them again."""
    run = Run("qwen3", "partial_dtensor", tp=2)
    model = build(run)
    table = predicted(run, model)
    assert table.tied == (frozenset({"tok_embeddings.weight", "lm_head.weight"}),)
    dims = titan.parallel_dims(run)
    titan.parallelize(run, model, dims)
    embedding, head = get(model, "tok_embeddings.weight"), get(model, "lm_head.weight")
    assert embedding is not head  # untied by parallelize ...
    assert plan_from_torchtitan(model, mesh_axes=run.mesh_axes).tied_pairs
    model.to_empty(device="cpu")
    with torch.no_grad():
        function_of(model, "init_weights")(buffer_device=None)
    assert get(model, "tok_embeddings.weight") is get(model, "lm_head.weight")  # ... tied again


def test_experts_fewer_than_their_ranks_are_sharded_on_dim_1() -> None:
    """torchtitan's FSDP rule, as the FSDP comparisons above confirm it."""
    parallel_dims = function("torchtitan.distributed", "ParallelDims")
    experts = "layers.1.moe.routed_experts.inner_experts."
    weights = [experts + w for w in ("w1_EFD", "w2_EDF", "w3_EFD")]

    def dims(run: Run) -> dict[str, int]:
        degrees = parallel_dims(
            dp_replicate=1,
            dp_shard=-1,
            cp=1,
            tp=run.tp,
            pp=1,
            ep=run.ep,
            world_size=8,
            spmd_backend=run.backend,
        )
        return shard_dims_from_torchtitan(build(run), parallel_dims=degrees)

    # 4 experts over efsdp 4 x ep 2 = 8 ranks: each expert's rows split
    assert dims(Run("deepseek_v3", "full_dtensor", tp=2, ep=2, experts=4)) == dict.fromkeys(
        weights, 1
    )
    # without ep: partial_dtensor shards over fsdp (4 ranks), full_dtensor over fsdp x tp (8)
    assert dims(Run("deepseek_v3", "partial_dtensor", tp=2, experts=4)) == dict.fromkeys(weights, 0)
    assert dims(Run("deepseek_v3", "full_dtensor", tp=2, experts=4)) == dict.fromkeys(weights, 1)
    # 8 experts over 8 ranks: whole experts
    assert dims(Run("deepseek_v3", "full_dtensor", tp=2, ep=8)) == dict.fromkeys(weights, 0)


def test_activation_checkpointing_names_as_the_state_dict_does(titan: Titan) -> None:
    """torchtitan wraps each block (``layers.0._checkpoint_wrapped_module.…``); the plan
    names every parameter as torch's state dict does."""
    run = Run("deepseek_v3", "partial_dtensor", tp=2, ep=2, checkpointing=True)
    model = build(run)
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    titan.parallelize(run, model, titan.parallel_dims(run))
    wrapped = names(model)
    assert any("._checkpoint_wrapped_module." in name for name in wrapped)
    assert plan_from_torchtitan(model, mesh_axes=run.mesh_axes) == plan
    keys = set(model.state_dict())
    planned = [fqn for fqn, _, _ in plan.named_placements()]
    assert planned and set(planned) <= keys
    assert {state_dict_fqn(name) for name in wrapped} <= keys


# ---------------------------------------------------------------------------------------
# layouts torchtitan declares, read one by one (torchtitan applying them is the oracle)


def spmd() -> object:
    return module("spmd_types")


def layout(tp: object, *, partition_spec: object = None, dp: object = None) -> object:
    """torchtitan's ``SpmdLayout`` of a dense parameter: ``dp`` and ``cp`` R, ``tp`` given."""
    axis = get(module("torchtitan.distributed.parallel_dims"), "MeshAxisName")
    replicated = get(spmd(), "R")
    types = {
        get(axis, "DP"): replicated if dp is None else dp,
        get(axis, "CP"): replicated,
        get(axis, "TP"): tp,
    }
    return function("torchtitan.distributed.parallel_dims", "SpmdLayout")(
        types, partition_spec=partition_spec
    )


def declare(model: nn.Module, path: str, state: dict[str, object]) -> None:
    """Give the module at ``path`` a sharding config with these state shardings."""
    target = model.get_submodule(path)
    config = function("torchtitan.protocols.sharding", "ShardingConfig")(state_shardings=state)
    object.__setattr__(target, "_sharding_config", config)  # as torchtitan's build() keeps it


def applied(run: Run, model: nn.Module, titan: Titan, fqn: str) -> str:
    """The placement on tp torchtitan's ``Module.parallelize`` gives ``fqn``."""
    titan.parallelize(run, model, titan.parallel_dims(run))
    param = model.get_parameter(fqn)
    assert isinstance(param, DTensor)
    return str(layout_of(param).placements[-1])


@pytest.mark.parametrize(
    ("tp", "spec", "expected"),
    [
        ("S(-1)", None, "S(1)"),  # counted from the end
        ("V", ("TP", None), "S(0)"),  # varying, the partition spec says which dim
        ("V", (None, "TP"), "S(1)"),
        ("I", None, "R"),  # invariant: the same on every rank
    ],
)
def test_declared_layouts_read_as_torchtitan_applies_them(
    tp: str, spec: tuple[str | None, ...] | None, expected: str, titan: Titan
) -> None:
    run = Run("llama3", "partial_dtensor", tp=2)
    model = build(run)
    kind = function_of(spmd(), "S")(-1) if tp == "S(-1)" else get(spmd(), tp)
    axis = get(module("torchtitan.distributed.parallel_dims"), "MeshAxisName")
    partition = None if spec is None else tuple(None if s is None else get(axis, s) for s in spec)
    declare(model, "layers.0.attention.wo", {"weight": layout(kind, partition_spec=partition)})
    fqn = "layers.0.attention.wo.weight"
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    ours = {fqn: str(p["tp"]) for fqn, _, p in plan.named_placements()}[fqn]
    # partial_dtensor resolves the layout to one DTensor placement on tp, as the others do
    assert ours == expected == applied(run, model, titan, fqn)


def test_a_parameter_its_config_leaves_out_is_a_problem(titan: Titan) -> None:
    run = Run("llama3", "partial_dtensor", tp=2)
    model = build(run)
    declare(model, "norm", {})
    with pytest.raises(PlanError) as raised:
        plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    assert [p.fqn for p in raised.value.problems] == ["norm.weight"]
    assert "declares no layout for 'weight'" in str(raised.value)
    with pytest.raises(ValueError, match="no placement declared"):  # torchtitan refuses it too
        titan.parallelize(run, model, titan.parallel_dims(run))


def test_layouts_no_parameter_can_have_are_problems() -> None:
    run = Run("llama3", "partial_dtensor", tp=2)
    model = build(run)
    shard = function_of(spmd(), "S")
    declare(model, "norm", {"weight": layout(get(spmd(), "P"))})
    declare(model, "layers.0.ffn_norm", {"weight": layout(get(spmd(), "R"), dp=shard(0))})
    declare(model, "layers.0.attention_norm", {"weight": layout(shard(1))})
    declare(model, "layers.1.ffn_norm", {"weight": layout(get(spmd(), "V"))})
    with pytest.raises(PlanError) as raised:
        plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    messages = {p.fqn: p.message for p in raised.value.problems}
    assert set(messages) == {
        "norm.weight",
        "layers.0.ffn_norm.weight",
        "layers.0.attention_norm.weight",
        "layers.1.ffn_norm.weight",
    }
    assert "is P (partial sums)" in messages["norm.weight"]
    assert "on torchtitan's data-parallel axis 'dp'" in messages["layers.0.ffn_norm.weight"]
    assert "shards dim 1 of a parameter with 1 dim(s)" in messages["layers.0.attention_norm.weight"]
    assert "partition_spec names no dim for 'tp'" in messages["layers.1.ffn_norm.weight"]


def test_expert_parallelism_and_the_mesh_must_agree() -> None:
    """A config updated for a run with ep, read without it, and the other way round."""
    with_ep = Run("qwen3_moe", "spmd_types", tp=2, ep=4)
    model = build(with_ep)
    with pytest.raises(PlanError) as raised:
        plan_from_torchtitan(model, mesh_axes=("dp_shard", "tp"))
    fqns = {p.fqn for p in raised.value.problems}
    assert "layers.0.moe.routed_experts.inner_experts.w1_EFD" in fqns
    assert "ep_axis is not one of mesh_axes" in str(raised.value)
    model = build(Run("qwen3_moe", "spmd_types", tp=2))
    with pytest.raises(PlanError, match="ep_axis='ep' is one of mesh_axes, but no parameter"):
        plan_from_torchtitan(model, mesh_axes=with_ep.mesh_axes)
    # ep_axis=None reads the model as a run without expert parallelism
    plan = plan_from_torchtitan(model, mesh_axes=with_ep.mesh_axes, ep_axis=None)
    assert not any(m.expert_parallel for m in plan.modules.values())


def test_a_run_without_tp_leaves_dense_parameters_plain() -> None:
    """torchtitan drops an axis of degree 1 (the partial_dtensor run with tp=1 above)."""
    run = Run("llama3", "partial_dtensor", tp=2)
    model = build(run)
    for mesh_axes, tp_axis in [
        (("fsdp",), "tp"),
        (("fsdp", "tp"), None),
        (Mesh({"fsdp": 8, "tp": 1}), "tp"),
    ]:
        assert not plan_from_torchtitan(model, mesh_axes=mesh_axes, tp_axis=tp_axis).modules
    by_names = plan_from_torchtitan(model, mesh_axes=("fsdp", "tp"))
    assert by_names.modules
    assert plan_from_torchtitan(model, mesh_axes=Mesh({"fsdp": 4, "tp": 2})) == by_names


def test_what_is_not_a_torchtitan_model() -> None:
    with pytest.raises(LayoutError, match="not a torchtitan model"):
        plan_from_torchtitan(nn.Linear(2, 2), mesh_axes=("tp",))
    with pytest.raises(LayoutError, match=r"must be a torch\.nn\.Module"):
        plan_from_torchtitan(object(), mesh_axes=("tp",))  # type: ignore[arg-type]
    unsharded = build(Run("llama3", "partial_dtensor", tp=2), sharded=False)
    with pytest.raises(LayoutError, match="no module of the model has a sharding config"):
        plan_from_torchtitan(unsharded, mesh_axes=("tp",))


def test_arguments_of_the_wrong_form() -> None:
    model = build(Run("llama3", "partial_dtensor", tp=2))
    with pytest.raises(LayoutError, match="not the string"):
        plan_from_torchtitan(model, mesh_axes="tp")
    with pytest.raises(LayoutError, match=r"plan_from_torchtitan\(tp_axis=...\)"):
        plan_from_torchtitan(model, mesh_axes=("tp",), tp_axis="t-p")
    with pytest.raises(LayoutError, match="not a degree >= 1"):
        shard_dims_from_torchtitan(model, parallel_dims=object())
