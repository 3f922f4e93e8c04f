"""The importers' last silent answers, each now true or refused, checked against torch.

- ``table_from_hf`` on meshes where FSDP shards the model refuses what ``fully_shard``
  cannot compose (MiniCPM5-MoE's unit styles, more than two source axes): torch's own
  ``fully_shard`` fails on the same layouts, on the fake process group.
- GPT-NeoX's ``query_key_value`` (one ``[q_h | k_h | v_h]`` block per head) and CodeGen's
  ``qkv_proj`` (four blocks its forward views whole) have a structure, so the lint flags
  the tensor-parallel plans that crash or compute wrong logits: on 2 gloo ranks, every
  plan it flags does, every plan it passes computes the single-process logits.
- Llama 4's experts ``gate_up_proj`` ``(E, H, 2I)`` is ``[gate | up]`` on dim 2, which
  its forward chunks: sharding dim 2 as one block is flagged and computes a wrong output
  on gloo ranks; transformers' own ``packed_rowwise`` (``_S(2, 2)``) is right.
- ``table_from_torchtitan`` is the complete table in one call, equal to the statements it
  replaces, tied aliases included.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Final

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard

from layout_algebra import (
    LayoutError,
    Mesh,
    ParamLayoutTable,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    build_table,
    complete_default,
    compose_table,
)
from layout_algebra.lint import lint
from layout_algebra.structure import Packed, Part
from layout_algebra.torch_bridge import (
    plan_from_torchtitan,
    shapes_from_module,
    state_dict_fqn,
    table_from_hf,
    table_from_module,
    table_from_torchtitan,
)
from tests import test_transformers as hf_cases
from tests.test_structure_gloo import PackedColwise
from tests.torch_oracle import MeshFactory, fully_sharded, layout_of, on_gloo
from tests.torchtitan_runs import Run, build

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from tests.torchtitan_runs import Titan

STRUCTURE_KINDS: Final = frozenset({"cuts-unit", "packed-contiguous", "experts"})


def structure_kinds(table: ParamLayoutTable, model: nn.Module, sizes: dict[str, int]) -> list[str]:
    """The structure problems ``lint`` finds in ``table`` for ``model``'s weights, by kind."""
    report = lint(table, shapes_from_module(model), mesh_sizes={"dense": sizes})
    return sorted(p.kind for p in report.problems if p.kind in STRUCTURE_KINDS)


def flagged(table: ParamLayoutTable, model: nn.Module, sizes: dict[str, int]) -> dict[str, str]:
    """The structure problems of ``table`` by FQN (one kind each)."""
    report = lint(table, shapes_from_module(model), mesh_sizes={"dense": sizes})
    return {p.fqn: p.kind for p in report.problems if p.kind in STRUCTURE_KINDS}


# ---------------------------------------------------------------------------------------
# table_from_hf where FSDP shards the model


def minicpm5_moe() -> PreTrainedModel:
    """MiniCPM5-MoE, tiny: 2 key/value heads under 5.25's ``unit_colwise``, 8 experts."""
    pytest.importorskip("transformers.models.minicpm5_moe")
    from transformers import MiniCPM5MoeConfig, MiniCPM5MoeForCausalLM  # noqa: PLC0415

    config = MiniCPM5MoeConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        moe_intermediate_size=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
    )
    return hf_cases._build(MiniCPM5MoeForCausalLM, config)


UNIT_STYLED: Final = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "kv"]
"""MiniCPM5-MoE's weights under ``unit_colwise``."""


@pytest.mark.usefixtures("fake_world")
def test_unit_styles_with_an_fsdp_axis_are_refused_as_fully_shard_fails() -> None:
    """With an FSDP axis of 4 ranks the unit-styled weights are refused, each named; torch's
    ``fully_shard`` fails on those weights as transformers lays them out, and composes the
    others. Without FSDP the same meshes read as before."""
    if hf_cases.installed() < (5, 25):
        pytest.skip("5.24 registers no unit style")
    dense, expert = Mesh({"fsdp": 4, "tp": 2}), Mesh({"efsdp": 2, "ep": 4})
    with pytest.raises(PlanError) as caught:
        table_from_hf(minicpm5_moe(), mesh_axes=dense, expert_axes=expert)
    problems = {p.fqn or "": p.message for p in caught.value.problems}
    assert sorted(problems) == sorted(UNIT_STYLED)
    assert all("(tp, unit_replicate) mesh" in m for m in problems.values())
    assert all("fully_shard" in m for m in problems.values())
    # the oracle: transformers' own tensor parallelism, then torch's fully_shard per layer
    run = hf_cases.Run(tp=2, fsdp=4, ep=4)
    model = hf_cases.transformers_tp_ep(minicpm5_moe(), run)
    fsdp_mesh = hf_cases.meshes(run).get_mesh("fsdp")
    with pytest.raises(RuntimeError, match="Cannot concatenate DeviceMeshes"):
        fully_shard(model.model.layers[0].self_attn, mesh=fsdp_mesh)
    fully_shard(model.model.layers[0].mlp, mesh=fsdp_mesh)  # colwise/rowwise compose
    # no FSDP (its axis one rank): 2 key/value heads over tp=2, read as colwise
    table = table_from_hf(
        minicpm5_moe(), mesh_axes=Mesh({"fsdp": 1, "tp": 2}), expert_axes=Mesh({"ep": 2})
    )
    assert {str(table[fqn]) for fqn in UNIT_STYLED} == {"dense[tp=S(0)]"}


@pytest.mark.usefixtures("fake_world")
def test_fsdp_refuses_more_than_two_source_axes_as_fully_shard_does(
    world_mesh: MeshFactory,
) -> None:
    """A dense mesh of three source axes and an FSDP axis: every layout the table would hold
    is refused (FSDP2's limit, named), as torch's ``fully_shard`` refuses such a parameter;
    two source axes compose, in torch too."""
    sizes = {"fsdp": 2, "tp": 2, "sp": 2, "x": 1}
    with pytest.raises(PlanError) as caught:
        table_from_hf(hf_cases.llama(), mesh_axes=Mesh(sizes))
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    problems = {p.fqn: p.message for p in caught.value.problems}
    assert "at most 2 source axes" in problems[q_proj]
    assert problems[q_proj].startswith(f"{q_proj}: dense[tp=S(0), sp=R, x=R]: FSDP2 composes")
    three = SourceLayout("dense", ["tp", "sp", "x"], [Shard(0), Replicate(), Replicate()])
    with pytest.raises(NotImplementedError, match="FSDP only supports 1D TP/EP or 2D EP\\+TP"):
        fully_sharded(world_mesh(sizes), three, (32, 32), shard="fsdp")
    two = {"fsdp": 2, "tp": 2, "sp": 2}
    table = table_from_hf(hf_cases.llama(), mesh_axes=Mesh(two))
    composed = compose_table(table, fsdp={"dense": "fsdp"}, mesh_sizes={"dense": two})
    param = fully_sharded(world_mesh(two), table[q_proj], (32, 32), shard="fsdp")
    assert layout_of(param) == composed[q_proj]


# ---------------------------------------------------------------------------------------
# GPT-NeoX's and CodeGen's fused attention


def neox(heads: int = 4, *, device: str = "meta") -> PreTrainedModel:
    """GPT-NeoX with ``heads`` heads of 8, one layer."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM  # noqa: PLC0415

    config = GPTNeoXConfig(
        vocab_size=50,
        hidden_size=8 * heads,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=heads,
        bos_token_id=0,
        eos_token_id=0,
    )
    with torch.device(device):
        return GPTNeoXForCausalLM(config)


def codegen(heads: int = 4, *, device: str = "meta") -> PreTrainedModel:
    """CodeGen with ``heads`` heads of 8, one layer (its forward's 4 blocks of q, v, k)."""
    from transformers import CodeGenConfig, CodeGenForCausalLM  # noqa: PLC0415

    config = CodeGenConfig(
        vocab_size=50,
        n_embd=8 * heads,
        n_layer=1,
        n_head=heads,
        rotary_dim=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    with torch.device(device):
        return CodeGenForCausalLM(config)


def same_layout_as_neox(kind: str) -> PreTrainedModel:
    """GPT-NeoX-Japanese, Persimmon and Bloom: 4 heads of 8, their forwards viewing
    ``query_key_value``'s output as GPT-NeoX's does, ``(..., heads, 3, head)``."""
    import transformers as hf  # noqa: PLC0415

    common: dict[str, Any] = {
        "vocab_size": 50,
        "hidden_size": 32,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    config: Any
    match kind:
        case "gpt_neox_japanese":
            config = hf.GPTNeoXJapaneseConfig(**common, num_hidden_layers=1, num_attention_heads=4)
            cls: Any = hf.GPTNeoXJapaneseForCausalLM
        case "persimmon":
            config = hf.PersimmonConfig(
                **common, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
            )
            cls = hf.PersimmonForCausalLM
        case _:
            config = hf.BloomConfig(**common, n_layer=1, n_head=4)
            cls = hf.BloomForCausalLM
    with torch.device("meta"):
        model: PreTrainedModel = cls(config)
        return model


PER_HEAD: Final = Packed([Part("qkv", 4, 24)])
"""4 heads of 8: 4 units of 24 rows, q, k and v of one head each."""
HEADS: Final = Packed([Part("o", 4, 8)])


def test_the_fused_attention_of_neox_and_codegen_is_read() -> None:
    """What the forwards view: GPT-NeoX ``(..., heads, 3 * head_size)``, CodeGen
    ``(..., 4, 3 * embed_dim / 4)`` split as q, v, k; the output projections' columns in
    heads."""
    structures = {fqn: dict(s.structure) for fqn, s in shapes_from_module(neox()).items()}
    attn = "gpt_neox.layers.0.attention"
    assert structures[f"{attn}.query_key_value.weight"] == {0: PER_HEAD}
    assert structures[f"{attn}.query_key_value.bias"] == {0: PER_HEAD}
    assert structures[f"{attn}.dense.weight"] == {1: HEADS}
    structures = {fqn: dict(s.structure) for fqn, s in shapes_from_module(codegen()).items()}
    attn = "transformer.h.0.attn"
    assert structures[f"{attn}.qkv_proj.weight"] == {0: Packed([Part("qvk", 4, 24)])}
    assert structures[f"{attn}.out_proj.weight"] == {1: HEADS}
    # 8 heads: still 4 blocks, of 2 heads' q, v and k each
    shapes = shapes_from_module(codegen(8))
    assert dict(shapes[f"{attn}.qkv_proj.weight"].structure) == {0: Packed([Part("qvk", 4, 48)])}


@pytest.mark.parametrize("kind", ["gpt_neox_japanese", "persimmon", "bloom"])
def test_the_same_per_head_layout_is_read_where_the_forward_views_it_so(kind: str) -> None:
    model = same_layout_as_neox(kind)
    structures = {fqn: dict(s.structure) for fqn, s in shapes_from_module(model).items()}
    fused = [fqn for fqn in structures if ".query_key_value." in fqn]
    assert fused
    assert all(structures[fqn] == {0: PER_HEAD} for fqn in fused)
    dense = [fqn for fqn in structures if fqn.endswith(".dense.weight")]
    assert [structures[fqn] for fqn in dense] == [{1: HEADS}]


def test_their_own_plans_are_flagged_where_the_forward_cannot_run() -> None:
    """The models' own ``colwise``/``rowwise`` plans: GPT-NeoX's 6 heads over tp=4 leave
    each rank 36 rows of 24-row heads (its view fails); CodeGen over tp=8 leaves each rank
    half a block (its view fails). Where tp divides the heads (the blocks), nothing."""
    model = neox(6)
    table = table_from_hf(model, mesh_axes=("tp",))
    attn = "gpt_neox.layers.0.attention"
    assert flagged(table, model, {"tp": 4}) == {
        f"{attn}.query_key_value.weight": "cuts-unit",
        f"{attn}.query_key_value.bias": "cuts-unit",
        f"{attn}.dense.weight": "cuts-unit",
    }
    assert flagged(table, model, {"tp": 2}) == flagged(table, model, {"tp": 3}) == {}
    model = codegen(8)
    table = table_from_hf(model, mesh_axes=("tp",))
    qkv = "transformer.h.0.attn.qkv_proj.weight"
    assert flagged(table, model, {"tp": 8}) == {qkv: "cuts-unit"}
    report = lint(table, shapes_from_module(model), mesh_sizes={"dense": {"tp": 8}})
    (problem,) = [p for p in report.problems if p.fqn == qkv]
    assert "the units of qvk (4 units of 48)" in problem.message
    assert "make the size of 'tp' divide 4 (1, 2 or 4)" in problem.message
    assert flagged(table, model, {"tp": 2}) == flagged(table, model, {"tp": 4}) == {}


# ---------------------------------------------------------------------------------------
# Llama 4's experts


def llama4_experts() -> nn.Module:
    """Llama 4's experts module, 2 experts, hidden 16, intermediate 8, random weights."""
    from transformers import Llama4TextConfig  # noqa: PLC0415
    from transformers.models.llama4.modeling_llama4 import Llama4TextExperts  # noqa: PLC0415

    config = Llama4TextConfig(hidden_size=16, intermediate_size=8, num_local_experts=2)
    torch.manual_seed(0)
    experts = Llama4TextExperts(config)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_()
    return experts


def test_llama4_gate_up_is_packed_on_the_dim_its_forward_chunks() -> None:
    """``gate_up_proj`` ``(E, H, 2I)``: ``bmm(x, gate_up_proj).chunk(2, dim=-1)``, so gate
    and up are dim 2. Sharding dim 2 as one block is flagged; transformers' own
    ``packed_rowwise`` (``_S(2, 2)``), and any shard of dim 1, are not."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig  # noqa: PLC0415

    config = Llama4TextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=16,
        intermediate_size_mlp=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        moe_layers=[0],
    )
    with torch.device("meta"):
        model = Llama4ForCausalLM(config)
    experts = "model.layers.0.feed_forward.experts"
    shapes = shapes_from_module(model)
    gate_up = f"{experts}.gate_up_proj"
    assert dict(shapes[gate_up].structure) == {
        0: Packed([Part("experts", 4)]),
        2: Packed([Part("gate", 16), Part("up", 16)]),
    }
    table = table_from_hf(model, mesh_axes=("tp",))
    assert str(table[gate_up]) == "dense[tp=_S(2, 2)]"  # transformers' packed_rowwise
    assert flagged(table, model, {"tp": 2}) == {}
    for placement, kinds in ((Shard(2), ["packed-contiguous"]), (Shard(1), [])):
        one = ParamLayoutTable({gate_up: SourceLayout("dense", ["tp"], [placement])})
        report = lint(one, {gate_up: shapes[gate_up]}, mesh_sizes={"dense": {"tp": 2}})
        assert [p.kind for p in report.problems] == kinds, placement


# ---------------------------------------------------------------------------------------
# the oracle on 2 gloo ranks: what the lint passes computes the same logits


WORLD: Final = 2

# name, model, placement of the fused qkv ("colwise" S(0), "packed" _S(0, 3)), the kinds
# the lint finds, what torch computes ("equal", "wrong" or "crash")
ATTENTION: Final = [
    ("GPT-NeoX 4 heads colwise", "neox4", "colwise", [], "equal"),
    ("GPT-NeoX 3 heads colwise", "neox3", "colwise", ["cuts-unit"] * 3, "crash"),
    ("GPT-NeoX 4 heads as [q | k | v]", "neox4", "packed", ["cuts-unit"] * 2, "wrong"),
    ("CodeGen colwise", "codegen", "colwise", [], "equal"),
    ("CodeGen as [q | k | v]", "codegen", "packed", ["cuts-unit"], "wrong"),
]
# name, gate_up_proj's placement, the kinds the lint finds, what torch computes
EXPERTS: Final = [
    ("packed_rowwise _S(2, 2)", "packed", [], "equal"),
    ("dim 2 as one block S(2)", "block", ["packed-contiguous"], "wrong"),
]


def _attention(kind: str) -> tuple[nn.Module, str, str, str]:
    """The model on the CPU with seeded weights, its attention's path, qkv and output."""
    torch.manual_seed(0)
    if kind.startswith("neox"):
        model = neox(int(kind[4:]), device="cpu")
        return model, "gpt_neox.layers.0.attention", "query_key_value", "dense"
    return codegen(device="cpu"), "transformer.h.0.attn", "qkv_proj", "out_proj"


def _outcome(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return "crash"
    return "equal" if torch.allclose(got, want, atol=1e-5) else "wrong"


def scenario(rank: int) -> dict[str, Any]:
    """Each case on this rank: its outcome and the structure kinds lint finds in the
    layouts torch gave the parameters."""
    mesh = MeshFactory(WORLD)({"tp": WORLD})
    found: dict[str, Any] = {}
    ids = torch.arange(12).reshape(2, 6)
    for name, kind, style, _, _ in ATTENTION:
        model, attn, qkv, out = _attention(kind)
        model.eval()
        with torch.no_grad():
            want = model(ids).logits
        qkv_style = PackedColwise(3) if style == "packed" else ColwiseParallel()
        plan = {f"{attn}.{qkv}": qkv_style, f"{attn}.{out}": RowwiseParallel()}
        parallel = parallelize_module(copy.deepcopy(model), mesh, plan)
        try:
            with torch.no_grad():
                got: torch.Tensor | None = parallel(ids).logits
        except RuntimeError:  # the forward cannot view its local rows
            got = None
        kinds = structure_kinds(table_from_module(parallel), model, {"tp": WORLD})
        found[name] = {"outcome": _outcome(got, want), "kinds": kinds}
    experts = llama4_experts()
    x = torch.randn(2 * 3, 16)
    with torch.no_grad():
        want = experts(x)
    weights = dict(experts.named_parameters())
    for name, style, _, _ in EXPERTS:
        placement = _StridedShard(2, split_factor=2) if style == "packed" else TorchShard(2)
        local = copy.deepcopy(experts)
        placed = {
            "gate_up_proj": distribute_tensor(
                weights["gate_up_proj"], mesh, [placement], src_data_rank=None
            ),
            "down_proj": distribute_tensor(
                weights["down_proj"], mesh, [TorchShard(1)], src_data_rank=None
            ),
        }
        for leaf, tensor in placed.items():
            setattr(local, leaf, nn.Parameter(tensor.to_local()))
        with torch.no_grad():
            got = local(x)
        dist.all_reduce(got)  # the row-parallel down_proj's partial sums, as moe_tp_experts
        table = ParamLayoutTable({k: layout_of(v) for k, v in placed.items()})
        found[name] = {
            "outcome": _outcome(got, want),
            "kinds": structure_kinds(table, experts, {"tp": WORLD}),
        }
    return found


@pytest.mark.distributed
def test_what_lint_passes_computes_the_same_logits_and_what_it_flags_does_not() -> None:
    by_rank = on_gloo(scenario, world_size=WORLD)
    cases = [(n, kinds, outcome) for n, _, _, kinds, outcome in ATTENTION]
    cases += [(n, kinds, outcome) for n, _, kinds, outcome in EXPERTS]
    for name, kinds, outcome in cases:
        seen = [ranks[name] for ranks in by_rank]
        assert {s["outcome"] for s in seen} == {outcome}, name
        assert seen[0]["kinds"] == sorted(kinds), name
        assert (outcome == "equal") == (not kinds), name


# ---------------------------------------------------------------------------------------
# table_from_torchtitan


def glue(run: Run, model: nn.Module) -> ParamLayoutTable:
    """The statements ``table_from_torchtitan`` replaces (tests/test_torchtitan.py's)."""
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    dense = tuple(a for a in run.mesh_axes if a in run.dense)
    expert = ("efsdp", "ep") if run.ep > 1 else None
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    fqns = [state_dict_fqn(name) for name in names]
    table = build_table(plan, dense, expert_axes=expert, fqns=fqns)
    return complete_default(table, fqns, dense, plain=True, tied_pairs=plan.tied_pairs)


TITAN_RUNS: Final = [
    Run("qwen3", "partial_dtensor", tp=2),
    Run("qwen3_moe", "full_dtensor", tp=2, ep=4),
    Run("qwen3_moe", "spmd_types", tp=2),
    Run("deepseek_v3", "partial_dtensor", tp=2, replicate=2, experts=4),
    Run("gpt_oss", "partial_dtensor", tp=2, ep=2, checkpointing=True),
    Run("qwen3_moe", "partial_dtensor", tp=1, ep=4),
]


# torchtitan compiles its flex attention when imported, which imports torch's inductor
jit_warning = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


@pytest.mark.parametrize("run", TITAN_RUNS, ids=str)
@pytest.mark.usefixtures("fake_world")
@jit_warning
def test_table_from_torchtitan_is_the_glue_in_one_call(run: Run, titan: Titan) -> None:
    """From the run's ``ParallelDims`` and from its meshes by role: the table the eight
    statements made, before and after torchtitan's own parallelism (the model is read)."""
    model = build(run)
    expected = glue(run, model)
    dims = titan.parallel_dims(run)
    assert table_from_torchtitan(model, dims) == expected
    roles = {"dense": Mesh(run.dense)}
    if run.ep > 1:
        roles["expert"] = Mesh(run.expert)
    assert table_from_torchtitan(model, roles) == expected
    titan.parallelize(run, model, dims)
    assert table_from_torchtitan(model, dims) == expected


@pytest.mark.usefixtures("fake_world")
@jit_warning
def test_table_from_torchtitan_keeps_tied_aliases(titan: Titan) -> None:
    """qwen3's debug model ties its embedding and head: one parameter, two names. The
    table holds both in one group; a glue reading plain ``named_parameters()`` (one name
    per parameter) gets the plan's tie refused as a misspelt key."""
    run = Run("qwen3", "full_dtensor", tp=2)
    model = build(run)
    tied = {"tok_embeddings.weight", "lm_head.weight"}
    table = table_from_torchtitan(model, titan.parallel_dims(run))
    assert table.tied == (frozenset(tied),)
    assert tied <= set(table)
    assert str(table["lm_head.weight"]) == str(table["tok_embeddings.weight"])
    plan = plan_from_torchtitan(model, mesh_axes=run.mesh_axes)
    dense = tuple(a for a in run.mesh_axes if a in run.dense)
    plain = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in plain
    with pytest.raises(PlanError, match=r"'lm_head.weight' .* fix its spelling"):
        build_table(plan, dense, fqns=plain)


def test_table_from_torchtitan_refuses_what_is_no_run() -> None:
    """Meshes without a dense role, an unknown role, or an object without torchtitan's
    degrees: a ``LayoutError`` naming ``meshes``."""
    model = nn.Linear(2, 2)
    for meshes, says in (
        ({"expert": Mesh({"ep": 2})}, "has no 'dense' mesh"),
        ({"dense": Mesh({"tp": 2}), "experts": Mesh({"ep": 2})}, "has the role 'experts'"),
        (object(), "its 'pp' is None, not a degree >= 1"),
    ):
        with pytest.raises(LayoutError, match=r"table_from_torchtitan\(meshes=\.\.\.\)") as info:
            table_from_torchtitan(model, meshes)
        assert says in str(info.value)
