"""plan_from_hf against transformers' own tensor and expert parallelism.

The oracles, on the fake 8-rank process group: transformers' own application of a
model's ``tp_plan``/``ep_plan`` to a model built on the meta device — the functions
``from_pretrained(..., distributed_config=...)`` calls (``apply_tensor_parallelism``,
``apply_expert_parallelism``, then ``maybe_distribute_model`` for the whole of it with
FSDP2, and ``tie_weights`` as loading ends) on transformers' own meshes — read back with
``table_from_module``; and each style's own ``shard_param`` on parameters of every rank.
No weights are needed: ``from_pretrained`` shards the model before it loads any.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    PlanError,
    ShardingPlan,
    build_table,
    complete_default,
)
from layout_algebra.torch_bridge import plan_from_hf, table_from_module
from layout_algebra.torch_bridge.transformers import KNOWN_STYLES, _wildcards
from tests.test_parallelize import assert_fsdp_as_predicted, fqns

if TYPE_CHECKING:
    from transformers import MixtralConfig, PreTrainedConfig, PreTrainedModel
    from transformers.distributed.utils import TransformersDeviceMesh

pytestmark = pytest.mark.usefixtures("fake_world")

DENSE = ("pp", "dp_replicate", "fsdp", "tp")
EXPERT = ("pp", "dp_replicate", "efsdp", "ep")
"""transformers' two views of one world: dense layers and experts."""
AXES = ("pp", "dp_replicate", "fsdp", "tp", "efsdp", "ep")
VOCAB = 50
"""50 vocabulary rows over tp=4 are 13, 13, 13, 11: uneven."""


# ---------------------------------------------------------------------------------------
# the models, tiny, on the meta device, built as from_pretrained builds them


def _small(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    return base | extra


def llama(*, tied: bool = False) -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - slow import

    return _build(LlamaForCausalLM, LlamaConfig(**_small(tie_word_embeddings=tied)))


def qwen3_moe() -> PreTrainedModel:
    """Layer 0 a dense MLP (``mlp_only_layers``), layer 1 eight experts."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: PLC0415

    config = Qwen3MoeConfig(
        **_small(
            moe_intermediate_size=16,
            head_dim=8,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[0],
        )
    )
    return _build(Qwen3MoeForCausalLM, config)


def mixtral_config() -> MixtralConfig:
    """Every layer eight experts, the LM head tied to the embedding."""
    from transformers import MixtralConfig  # noqa: PLC0415

    return MixtralConfig(
        **_small(
            intermediate_size=16,
            num_local_experts=8,
            num_experts_per_tok=2,
            tie_word_embeddings=True,
        )
    )


def mixtral() -> PreTrainedModel:
    from transformers import MixtralForCausalLM  # noqa: PLC0415

    return _build(MixtralForCausalLM, mixtral_config())


def deepseek_v3() -> PreTrainedModel:
    """Multi-head latent attention (which its plan leaves unsharded), layer 0 dense,
    layer 1 eight routed experts and a shared one."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: PLC0415

    config = DeepseekV3Config(
        **_small(
            num_key_value_heads=4,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
        )
    )
    return _build(DeepseekV3ForCausalLM, config)


def _build(cls: type[PreTrainedModel], config: PreTrainedConfig) -> PreTrainedModel:
    """As ``from_pretrained`` builds a model before it shards it: untied, on meta."""
    from transformers import initialization  # noqa: PLC0415

    with initialization.no_tie_weights(), torch.device("meta"):
        return cls(config)


# ---------------------------------------------------------------------------------------
# transformers' meshes and its own application of its plans


@attrs.frozen
class Run:
    """One ``DistributedConfig``: its sizes, and this package's reading of its meshes."""

    tp: int
    fsdp: int
    ep: int = 1

    @property
    def efsdp(self) -> int:
        return self.fsdp * self.tp // self.ep

    def config(self) -> Any:
        from transformers.distributed.configuration_utils import (  # noqa: PLC0415
            DistributedConfig,
        )

        return DistributedConfig(tp_size=self.tp, fsdp_size=self.fsdp, ep_size=self.ep)

    def plan(self, model: nn.Module) -> ShardingPlan:
        return plan_from_hf(model, ep_axis="ep" if self.ep > 1 else None, mesh_axes=AXES)

    def predicted(self, model: nn.Module) -> ParamLayoutTable:
        """The package's table: the model's plans read, built, completed plain."""
        plan = self.plan(model)
        table = build_table(plan, dense_axes=DENSE, expert_axes=EXPERT)
        return complete_default(table, fqns(model), DENSE, plain=True, tied_pairs=plan.tied_pairs)

    def sizes(self) -> dict[str, dict[str, int]]:
        return {
            "dense": {"fsdp": self.fsdp, "tp": self.tp},
            "expert": {"efsdp": self.efsdp, "ep": self.ep},
        }


_MESHES: dict[Run, TransformersDeviceMesh] = {}


def meshes(run: Run) -> TransformersDeviceMesh:
    """transformers' own meshes for ``run``, built once per session."""
    found = _MESHES.get(run)
    if found is None:
        from transformers.distributed.utils import initialize_distributed_mesh  # noqa: PLC0415

        _, found = initialize_distributed_mesh(run.config())
        assert found is not None
        _MESHES[run] = found
    return found


def roles(mesh: TransformersDeviceMesh) -> dict[DeviceMesh, str]:
    return {mesh.get_mesh("ep"): "expert"}


def transformers_tp_ep(model: PreTrainedModel, run: Run) -> PreTrainedModel:
    """The model after transformers' own tensor and expert parallelism, tied again."""
    from transformers.distributed.expert_parallel import apply_expert_parallelism  # noqa: PLC0415
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # noqa: PLC0415

    mesh = meshes(run)
    tp_plan, ep_plan, _ = model._resolve_parallel_plans(run.config())
    apply_tensor_parallelism(model, mesh.get_mesh("tp"), tp_plan)
    if run.ep > 1:
        apply_expert_parallelism(model, mesh.get_mesh("ep"), mesh.get_mesh("tp"), ep_plan)
    model.tie_weights(recompute_mapping=False)
    return model


def transformers_all(model: PreTrainedModel, run: Run) -> PreTrainedModel:
    """The model after all of ``from_pretrained``'s parallelism: TP, EP, FSDP2, tied."""
    model = type(model).maybe_distribute_model(model, run.config(), meshes(run))
    model.tie_weights(recompute_mapping=False)
    return model


CASES: dict[str, tuple[Callable[[], PreTrainedModel], Run]] = {
    "llama tp=4": (llama, Run(tp=4, fsdp=2)),
    "llama tied tp=4": (lambda: llama(tied=True), Run(tp=4, fsdp=2)),
    "qwen3-moe tp=2 ep=4": (qwen3_moe, Run(tp=2, fsdp=4, ep=4)),
    "qwen3-moe tp=4": (qwen3_moe, Run(tp=4, fsdp=2)),
    "mixtral tp=4": (mixtral, Run(tp=4, fsdp=2)),
    "mixtral tp=4 ep=4": (mixtral, Run(tp=4, fsdp=2, ep=4)),
    "deepseek-v3 tp=2 ep=8": (deepseek_v3, Run(tp=2, fsdp=4, ep=8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_gives_what_transformers_gives(case: str) -> None:
    build, run = CASES[case]
    model = build()
    expected = run.predicted(model)
    transformers_tp_ep(model, run)
    assert table_from_module(model, roles=roles(meshes(run))) == expected


@pytest.mark.parametrize("case", list(CASES))
def test_plan_then_fsdp_as_from_pretrained_does(case: str) -> None:
    build, run = CASES[case]
    model = build()
    expected = run.predicted(model)
    transformers_all(model, run)
    assert_fsdp_as_predicted(
        model, expected, fsdp={"dense": "fsdp", "expert": "efsdp"}, sizes=run.sizes()
    )


def layouts(table: ParamLayoutTable, *names: str) -> dict[str, str]:
    return {name: str(table[name]) for name in names}


def test_what_each_architecture_gets() -> None:
    """The readings the comparisons above confirm, spelled out for a reader."""
    run = Run(tp=4, fsdp=2)
    table = run.predicted(mixtral())
    assert layouts(
        table,
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.experts.gate_up_proj",
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.gate.weight",
        "model.norm.weight",
    ) == {
        # transformers shards the input embedding on the vocabulary when it has a plan
        "model.embed_tokens.weight": "dense[tp=S(0)]",
        "lm_head.weight": "dense[tp=S(0)]",
        "model.layers.0.self_attn.q_proj.weight": "dense[tp=S(0)]",
        "model.layers.0.self_attn.o_proj.weight": "dense[tp=S(1)]",
        # packed_colwise: gate and up halves each split over tp; rowwise's -1 is dim 2
        "model.layers.0.mlp.experts.gate_up_proj": "dense[tp=_S(1, 2)]",
        "model.layers.0.mlp.experts.down_proj": "dense[tp=S(2)]",
        # the router and the norms: no rule, left plain
        "model.layers.0.mlp.gate.weight": "dense[]",
        "model.norm.weight": "dense[]",
    }
    assert table.tied == (frozenset({"model.embed_tokens.weight", "lm_head.weight"}),)
    # With expert parallelism its rules win: the experts go whole to their ep rank.
    table = Run(tp=4, fsdp=2, ep=4).predicted(mixtral())
    assert layouts(
        table, "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"
    ) == {
        "model.layers.0.mlp.experts.gate_up_proj": "expert[ep=S(0)]",
        "model.layers.0.mlp.experts.down_proj": "expert[ep=S(0)]",
    }
    # Qwen3's per-head norms are "replicated_with_grad_allreduce": a gradient hook only,
    # so transformers leaves them plain tensors (not replicated DTensors).
    table = Run(tp=2, fsdp=4, ep=4).predicted(qwen3_moe())
    assert layouts(
        table,
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.gate_up_proj",
    ) == {
        "model.layers.0.self_attn.q_norm.weight": "dense[]",
        "model.layers.0.mlp.gate_proj.weight": "dense[tp=S(0)]",  # the dense layer's MLP
        "model.layers.1.mlp.gate.weight": "dense[]",
        "model.layers.1.mlp.experts.gate_up_proj": "expert[ep=S(0)]",
    }
    # DeepSeek-V3's plan leaves multi-head latent attention unsharded.
    table = Run(tp=2, fsdp=4, ep=8).predicted(deepseek_v3())
    attention = [f for f in table if ".self_attn." in f]
    assert attention and all(str(table[f]) == "dense[]" for f in attention)
    assert str(table["model.layers.1.mlp.shared_experts.down_proj.weight"]) == "dense[tp=S(1)]"


def test_tied_head_takes_the_embeddings_layout() -> None:
    """The embedding over its hidden dim (S(1)) and the head over its rows (S(0)):
    transformers shards each, then ties the head to the embedding's parameter, so both
    end up S(1); the head's own rule never shows."""
    run = Run(tp=4, fsdp=2)
    model = llama(tied=True)
    model._tp_plan = {**model.tp_plan, "model.embed_tokens": "embedding_colwise"}
    plan = run.plan(model)
    assert "lm_head" not in plan.modules
    assert plan.tied_pairs == (("model.embed_tokens.weight", "lm_head.weight"),)
    expected = run.predicted(model)
    assert str(expected["lm_head.weight"]) == "dense[tp=S(1)]"
    transformers_tp_ep(model, run)
    assert table_from_module(model) == expected


@pytest.mark.parametrize("version", ["5.25.0", "6.0.0.dev0", "5.30"])
def test_a_transformers_newer_than_the_known_styles_is_refused(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import transformers  # noqa: PLC0415

    model = llama()
    monkeypatch.setattr(transformers, "__version__", version)
    with pytest.raises(
        LayoutError, match=rf"transformers {re.escape(version)} is newer than 5\.24"
    ):
        plan_from_hf(model, ep_axis=None, mesh_axes=AXES)
    for older in ("5.24.0", "4.57.1", "5.24.0.dev0", "unknown"):
        monkeypatch.setattr(transformers, "__version__", older)
        assert plan_from_hf(model, ep_axis=None, mesh_axes=AXES).modules


def test_a_model_built_tied_reads_the_same() -> None:
    """Built as usual (the head already the embedding's parameter) or as from_pretrained
    builds it (untied until loaded), the model's plan reads the same."""
    from transformers import MixtralForCausalLM  # noqa: PLC0415

    untied = mixtral()
    with torch.device("meta"):
        tied = MixtralForCausalLM(mixtral_config())
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    run = Run(tp=4, fsdp=2, ep=4)
    assert run.plan(tied) == run.plan(untied)


# ---------------------------------------------------------------------------------------
# every style transformers registers, on parameters of every rank


def _registered() -> list[str]:
    import transformers.distributed.expert_parallel  # noqa: PLC0415 - registers its styles
    import transformers.distributed.tensor_parallel  # noqa: F401, PLC0415
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES  # noqa: PLC0415

    return sorted(ALL_PARALLEL_STYLES)


def test_known_styles_are_the_installed_ones() -> None:
    assert sorted(KNOWN_STYLES) == _registered()


class Probe(nn.Module):
    """Parameters of ranks 1 to 3, one named ``bias``, as styles meet them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(8, 12))
        self.bias = nn.Parameter(torch.empty(8))
        self.experts = nn.Parameter(torch.empty(4, 8, 12))
        self.experts_bias = nn.Parameter(torch.empty(4, 8))


class Holder(nn.Module):
    """A module that carries a ``tp_plan`` as a transformers model does."""

    def __init__(self, plan: dict[str, str]) -> None:
        super().__init__()
        self.probe = Probe()
        self.lin = nn.Linear(12, 8)
        self.tp_plan = plan
        self.all_tied_weights_keys: dict[str, str] = {}


MODULE_LEVEL_UNSUPPORTED = {"mla_kv_a_proj", "ep_dispatch_experts"}
"""Styles whose forward hook needs what a probe has not (a model config, two meshes)."""


def _styles() -> Iterator[str]:
    yield from sorted(KNOWN_STYLES)


@pytest.mark.parametrize("style", list(_styles()))
def test_each_style_places_as_its_shard_param_does(style: str) -> None:
    """Each style's placement for parameters of ranks 1-3 (biases included), named by
    parameter and through its module, equals what transformers' own style does."""
    from transformers.distributed.mixin import DistributedMixin  # noqa: PLC0415
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # noqa: PLC0415

    plan = {f"probe.{name}": style for name in ("weight", "bias", "experts", "experts_bias")}
    if style not in MODULE_LEVEL_UNSUPPORTED:
        plan["lin"] = style  # its parameters through their module, and its forward hooked
    with torch.device("meta"):
        model = Holder(plan)
    axes = ("fsdp", "tp")
    run = Run(tp=4, fsdp=2)
    expanded = DistributedMixin._expand_parallel_plan(model, plan)  # type: ignore[arg-type]  # a duck model
    try:
        sharding = plan_from_hf(model, ep_axis=None, mesh_axes=axes)
    except PlanError as e:
        # a dim the parameter lacks (S(1) of a bias): transformers fails on it too
        assert all("which it does not have" in p.message for p in e.problems)
        with pytest.raises(IndexError):
            apply_tensor_parallelism(model, meshes(run).get_mesh("tp"), expanded)
        return
    table = build_table(sharding, dense_axes=axes)
    expected = complete_default(table, fqns(model), axes, plain=True)
    apply_tensor_parallelism(model, meshes(run).get_mesh("tp"), expanded)
    assert table_from_module(model) == expected


# ---------------------------------------------------------------------------------------
# what transformers refuses, refused here, every problem at once


def test_expert_axis_without_an_expert_plan() -> None:
    """Llama has no ep_plan: transformers refuses ep_size > 1, and an active ep axis here."""
    model = llama()
    with pytest.raises(
        PlanError, match=r"ep_axis='ep' is one of mesh_axes, but the model's ep_plan is empty"
    ):
        plan_from_hf(model, mesh_axes=AXES)
    with pytest.raises(ValueError, match=r"has no `ep_plan`"):
        model._resolve_parallel_plans(Run(tp=4, fsdp=2, ep=4).config())
    # ep not among the axes, or switched off: read the tensor-parallel plan only
    dense_only = plan_from_hf(model, mesh_axes=DENSE)
    assert dense_only.modules == plan_from_hf(model, ep_axis=None, mesh_axes=AXES).modules


def test_styles_transformers_refuses() -> None:
    model = mixtral()
    model._ep_plan = {**model.ep_plan, "model.layers.*.mlp.experts": "moe_tp_experts"}
    model._tp_plan = {**model.tp_plan, "model.norm": "shiny"}
    with pytest.raises(PlanError) as caught:
        plan_from_hf(model, mesh_axes=AXES)
    messages = [p.message for p in caught.value.problems]
    assert len(messages) == 2
    assert (
        "model.tp_plan['model.norm']: style 'shiny' is not one transformers registers"
        in messages[0]
    )
    assert "style 'moe_tp_experts' does not belong in an ep_plan" in messages[1]
    with pytest.raises(ValueError, match=r"`moe_tp_experts` is a tensor-parallel style"):
        model._resolve_parallel_plans(Run(tp=4, fsdp=2, ep=4).config())
    model = mixtral()
    model._tp_plan = {**model.tp_plan, "model.norm": "shiny"}
    with pytest.raises(ValueError, match=r"Unsupported `tp_plan` styles: \{'shiny'\}"):
        model._resolve_parallel_plans(Run(tp=4, fsdp=2).config())


def test_shard_dim_a_parameter_lacks() -> None:
    with torch.device("meta"):
        model = Holder({"probe.weight": "colwise"})
    model.probe.weight = nn.Parameter(torch.empty((), device="meta"))
    with pytest.raises(
        PlanError,
        match=r"probe.weight: style 'colwise' \(tp_plan\) shards dim -2 of a parameter with 0 dim",
    ):
        plan_from_hf(model, ep_axis=None, mesh_axes=["tp"])


def test_not_a_transformers_model() -> None:
    with pytest.raises(LayoutError, match=r"a Linear has neither tp_plan nor ep_plan"):
        plan_from_hf(nn.Linear(2, 2), mesh_axes=AXES)
    with pytest.raises(
        LayoutError, match=r"plan_from_hf\(model=\.\.\.\) must be a torch.nn.Module"
    ):
        plan_from_hf("llama", mesh_axes=AXES)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(LayoutError, match=r"^plan_from_hf\(ep_axis=\.\.\.\): "):
        plan_from_hf(llama(), ep_axis=3, mesh_axes=AXES)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(
        LayoutError, match=r"^plan_from_hf\(mesh_axes=\.\.\.\) must be a collection"
    ):
        plan_from_hf(llama(), mesh_axes="tp")
    with torch.device("meta"):
        model = Holder({"probe.weight": "colwise"})
    model.all_tied_weights_keys = {"head.weight": "probe.weight"}
    with pytest.raises(PlanError, match=r"'head.weight' is not a parameter of the model"):
        plan_from_hf(model, ep_axis=None, mesh_axes=["tp"])


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.12.mlp.up_proj",
        "a.0.1.b",
        "a.0.1.2.b",
        "0.weight",
        "x.w1",
        "h.3",
        "h.03.x",
        "h.٣.x",
    ],
)
def test_layer_numbers_read_as_transformers_reads_them(name: str) -> None:
    from transformers.distributed.parallel_utils import (  # noqa: PLC0415
        replace_layer_number_by_wildcard,
    )

    assert _wildcards(name) == replace_layer_number_by_wildcard(name)


def test_the_package_never_imports_transformers() -> None:
    """The model object brings transformers; importing the package and its bridge does not."""
    code = (
        "import sys, layout_algebra, layout_algebra.torch_bridge, layout_algebra.cli\n"
        "found = sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
