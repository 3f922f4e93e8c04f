"""plan_from_hf against transformers' own tensor and expert parallelism.

The oracles, on the fake 8-rank process group: transformers' own application of a
model's ``tp_plan``/``ep_plan`` to a model built on the meta device — the functions
``from_pretrained(..., distributed_config=...)`` calls (``apply_tensor_parallelism``,
``apply_expert_parallelism``, then ``maybe_distribute_model`` for the whole of it with
FSDP2, and ``tie_weights`` as loading ends) on transformers' own meshes — read back with
``table_from_module``; and each style's own ``shard_param`` on parameters of every rank.
No weights are needed: ``from_pretrained`` shards the model before it loads any.

Every test runs against the transformers installed, whichever known release it is (5.24
and earlier, or 5.25): where the releases differ (their styles, the models' own plans,
the arguments their functions take) the test says what each does. Tests of the choice
of release set ``transformers.__version__``, so each release's styles are read in either.
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
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    PlanError,
    ShardingPlan,
    build_table,
    complete_default,
    local_shape_and_offset,
)
from layout_algebra.torch_bridge import plan_from_hf, table_from_module
from layout_algebra.torch_bridge.transformers import (
    _RELEASES,
    KNOWN_STYLES,
    NEWEST_KNOWN,
    STYLES_BY_RELEASE,
    _OwnMesh,
    _wildcards,
)
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


def installed() -> tuple[int, int]:
    """The known release whose styles the installed transformers registers: the key of
    ``STYLES_BY_RELEASE`` its (major, minor) falls under."""
    import transformers  # noqa: PLC0415 - slow import

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return min(last for last in STYLES_BY_RELEASE if (major, minor) <= last)


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


def llama_heads(*, kv_heads: int) -> PreTrainedModel:
    """Llama with ``kv_heads`` key/value heads (4 attention heads of 8)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - slow import

    return _build(LlamaForCausalLM, LlamaConfig(**_small(num_key_value_heads=kv_heads)))


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


EXPERTS_OVER_TP = {
    "model.layers.*.mlp.experts.gate_up_proj": "packed_colwise",
    "model.layers.*.mlp.experts.down_proj": "rowwise",
    "model.layers.*.mlp.experts": "moe_tp_experts",
}
"""Experts split over tp, each rank a part of every expert: Mixtral's own rules up to 5.24;
5.25's Mixtral leaves its experts to expert parallelism, its Llama 4 still splits them so."""


def mixtral_experts_over_tp() -> PreTrainedModel:
    model = mixtral()
    model._tp_plan = {**model.tp_plan, **EXPERTS_OVER_TP}
    return model


def deepseek_v3() -> PreTrainedModel:
    """Multi-head latent attention (which its plan leaves unsharded up to 5.24), layer 0
    dense, layer 1 eight routed experts and a shared one."""
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


def gemma4(*, moe: bool = False) -> PreTrainedModel:
    """gemma4's text model, its default dense MLP (or, with ``moe``, its MoE block too):
    its ep_plan names both the MLP and the experts."""
    pytest.importorskip("transformers.models.gemma4")
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig  # noqa: PLC0415

    experts = {"enable_moe_block": True, "num_experts": 8, "top_k_experts": 2} if moe else {}
    config = Gemma4TextConfig(
        **_small(
            head_dim=8,
            global_head_dim=8,
            layer_types=["sliding_attention", "full_attention"],
            vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=8,
            moe_intermediate_size=16,
            **experts,
        )
    )
    return _build(Gemma4ForCausalLM, config)


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
    # 5.25's styles take the model's config and its meshes (a unit style builds its own
    # mesh from them); maybe_distribute_model sets the meshes first, as here. 5.24 reads
    # neither.
    model._mesh_manager = mesh
    apply_tensor_parallelism(model, mesh.get_mesh("tp"), tp_plan)
    # 5.25's maybe_distribute_model applies the ep plan only when a rule of it reaches an
    # experts module with ep_dispatch_experts (a dense gemma4 has none)
    dispatch = "ep_dispatch_experts" in ep_plan.values() or installed() < (5, 25)
    if run.ep > 1 and dispatch:
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
    "mixtral experts over tp=4": (mixtral_experts_over_tp, Run(tp=4, fsdp=2)),
    "mixtral tp=4 ep=4": (mixtral, Run(tp=4, fsdp=2, ep=4)),
    "deepseek-v3 tp=2 ep=8": (deepseek_v3, Run(tp=2, fsdp=4, ep=8)),
    "gemma4 dense tp=2 ep=2": (gemma4, Run(tp=2, fsdp=4, ep=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_gives_what_transformers_gives(case: str) -> None:
    build, run = CASES[case]
    model = build()
    expected = run.predicted(model)
    transformers_tp_ep(model, run)
    assert table_from_module(model, roles=roles(meshes(run))) == expected


@pytest.mark.parametrize(
    "case", [c for c, (_, r) in CASES.items() if r.ep > 1 and "dense" not in c]
)
def test_transformers_meshes_read_back_without_roles(case: str) -> None:
    """transformers' own expert mesh is known by its dim names: no ``roles=`` needed."""
    build, run = CASES[case]
    model = transformers_tp_ep(build(), run)
    table = table_from_module(model)
    assert table == table_from_module(model, roles=roles(meshes(run)))
    assert any(layout.mesh == "expert" for _, layout in table.items())
    # after FSDP too: the expert parameters' mesh then holds efsdp as well
    model = transformers_all(build(), run)
    assert table_from_module(model) == table_from_module(model, roles=roles(meshes(run)))


@pytest.mark.parametrize("case", list(CASES))
def test_plan_then_fsdp_as_from_pretrained_does(case: str) -> None:
    build, run = CASES[case]
    model = build()
    expected = run.predicted(model)
    transformers_all(model, run)
    assert_fsdp_as_predicted(
        model, expected, fsdp={"dense": "fsdp", "expert": "efsdp"}, sizes=run.sizes()
    )


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_gemma4_ep_plan_applies_only_with_experts(moe: bool) -> None:
    """gemma4's ep_plan names its MLP and its experts. transformers drops the MLP's tp rules
    either way, and applies the ep plan only where an experts module takes
    ``ep_dispatch_experts``: the dense config's MLP stays plain, the MoE one's is on ep."""
    run = Run(tp=2, fsdp=4, ep=2)
    model = gemma4(moe=moe)
    expected = run.predicted(model)
    transformers_tp_ep(model, run)
    assert table_from_module(model, roles=roles(meshes(run))) == expected
    mlp = layouts(expected, *(f"model.layers.0.mlp.{m}.weight" for m in ("up_proj", "down_proj")))
    if moe:
        assert set(mlp.values()) == {"expert[ep=S(0)]", "expert[ep=S(1)]"}
    else:
        assert set(mlp.values()) == {"dense[]"}


def layouts(table: ParamLayoutTable, *names: str) -> dict[str, str]:
    return {name: str(table[name]) for name in names}


def test_what_each_architecture_gets() -> None:
    """The readings the comparisons above confirm, spelled out for a reader."""
    newer = installed() >= (5, 25)  # the models' own plans changed in 5.25, not the styles
    run = Run(tp=4, fsdp=2)
    table = run.predicted(mixtral())
    experts = ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj")
    assert layouts(
        table,
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        *experts,
        "model.layers.0.mlp.gate.weight",
        "model.norm.weight",
    ) == {
        # transformers shards the input embedding on the vocabulary when it has a plan
        "model.embed_tokens.weight": "dense[tp=S(0)]",
        "lm_head.weight": "dense[tp=S(0)]",
        "model.layers.0.self_attn.q_proj.weight": "dense[tp=S(0)]",
        "model.layers.0.self_attn.o_proj.weight": "dense[tp=S(1)]",
        # 5.25's Mixtral leaves its experts to expert parallelism: tp alone keeps them whole
        "model.layers.0.mlp.experts.gate_up_proj": "dense[]" if newer else "dense[tp=_S(1, 2)]",
        "model.layers.0.mlp.experts.down_proj": "dense[]" if newer else "dense[tp=S(2)]",
        # the router and the norms: no rule, left plain
        "model.layers.0.mlp.gate.weight": "dense[]",
        "model.norm.weight": "dense[]",
    }
    assert table.tied == (frozenset({"model.embed_tokens.weight", "lm_head.weight"}),)
    # Experts over tp by their rules (Mixtral's own up to 5.24): packed_colwise splits the
    # gate and up halves each over tp; rowwise's -1 is dim 2 of a 3-D weight.
    table = run.predicted(mixtral_experts_over_tp())
    assert layouts(table, *experts) == {
        "model.layers.0.mlp.experts.gate_up_proj": "dense[tp=_S(1, 2)]",
        "model.layers.0.mlp.experts.down_proj": "dense[tp=S(2)]",
    }
    # With expert parallelism its rules win: the experts go whole to their ep rank.
    table = Run(tp=4, fsdp=2, ep=4).predicted(mixtral_experts_over_tp())
    assert layouts(table, *experts) == {
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
    # DeepSeek-V3's multi-head latent attention: unsharded by the plan up to 5.24; 5.25's
    # splits its up-projections and output over tp, and kv_a_proj_with_mqa's
    # "mla_kv_a_proj" only hooks the forward.
    table = Run(tp=2, fsdp=4, ep=8).predicted(deepseek_v3())
    attention = {f: str(table[f]) for f in table if f.startswith("model.layers.1.self_attn.")}
    sharded = {
        "model.layers.1.self_attn.q_b_proj.weight": "dense[tp=S(0)]",
        "model.layers.1.self_attn.kv_b_proj.weight": "dense[tp=S(0)]",
        "model.layers.1.self_attn.o_proj.weight": "dense[tp=S(1)]",
    }
    assert attention == {f: "dense[]" for f in attention} | (sharded if newer else {})
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


@pytest.mark.parametrize("version", ["5.26.0", "6.0.0.dev0", "5.30"])
def test_a_transformers_newer_than_the_known_styles_is_refused(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    model = llama()
    # the module plan_from_hf reads: importing a model class may put a new one in its place
    transformers = sys.modules["transformers"]
    monkeypatch.setattr(transformers, "__version__", version)
    with pytest.raises(
        LayoutError, match=rf"transformers {re.escape(version)} is newer than 5\.25, the newest"
    ):
        plan_from_hf(model, ep_axis=None, mesh_axes=AXES)
    for older in ("5.25.0", "5.24.0", "4.57.1", "5.24.0.dev0", "5.25.0rc1", "unknown"):
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
    """The installed release's styles are those its transformers registers; the newest
    release's are ``KNOWN_STYLES``; the releases differ only by what 5.25 added and dropped,
    and share the rule of every style both register."""
    assert sorted(STYLES_BY_RELEASE[installed()]) == _registered()
    assert NEWEST_KNOWN == max(STYLES_BY_RELEASE) == (5, 25)
    assert STYLES_BY_RELEASE[NEWEST_KNOWN] == KNOWN_STYLES
    old, new = _RELEASES[(5, 24)], _RELEASES[(5, 25)]
    assert new.rules.keys() - old.rules.keys() == {"unit_colwise", "unit_rowwise"}
    assert old.rules.keys() - new.rules.keys() == {"moe_identity_expert"} == new.gone.keys()
    assert all(new.rules[style] is rule for style, rule in old.rules.items() if style in new.rules)
    for known in _RELEASES.values():
        # what a message tells to use instead is a style of the same release
        instead = {
            rule(leaf, ndim).instead  # type: ignore[union-attr]  # an _OwnMesh, checked
            for rule in known.rules.values()
            for leaf, ndim in (("weight", 2), ("bias", 1))
            if isinstance(rule(leaf, ndim), _OwnMesh)
        }
        assert {*known.ep_styles, *instead} <= known.rules.keys()


class Probe(nn.Module):
    """Parameters of ranks 1 to 3, one named ``bias``, as styles meet them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(8, 12))
        self.bias = nn.Parameter(torch.empty(8))
        self.experts = nn.Parameter(torch.empty(4, 8, 12))
        self.experts_bias = nn.Parameter(torch.empty(4, 8))


class Holder(nn.Module):
    """A module that carries a ``tp_plan`` as a transformers model does, and a config
    (the styles of 5.25 read it: a unit style counts heads of ``head_dim`` rows)."""

    def __init__(self, plan: dict[str, str], *, config: object = None) -> None:
        super().__init__()
        self.probe = Probe()
        self.lin = nn.Linear(12, 8)
        self.tp_plan = plan
        self.config = config
        self._mesh_manager: object = None  # what 5.25's apply_tensor_parallelism reads
        self.all_tied_weights_keys: dict[str, str] = {}


def holder(plan: dict[str, str]) -> Holder:
    """A ``Holder`` on the meta device whose heads are 4 rows: ``probe.weight`` and
    ``lin.weight`` have 2 in their rows and 3 in their columns."""
    from transformers import LlamaConfig  # noqa: PLC0415

    with torch.device("meta"):
        return Holder(plan, config=LlamaConfig(head_dim=4))


UNIT_STYLES = frozenset({"unit_colwise", "unit_rowwise"})
"""5.25's styles that put a weight on a mesh of their own, refused here."""


def _styles() -> Iterator[str]:
    """The styles of the release installed."""
    yield from sorted(STYLES_BY_RELEASE[installed()])


@pytest.mark.parametrize("style", list(_styles()))
def test_each_style_places_as_its_shard_param_does(style: str) -> None:
    """Each style's placement for parameters of ranks 1-3 (biases included), named by
    parameter and through its module, equals what transformers' own style does."""
    from transformers.distributed.mixin import DistributedMixin  # noqa: PLC0415
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # noqa: PLC0415

    plan = {f"probe.{name}": style for name in ("weight", "bias", "experts", "experts_bias")}
    plan["lin"] = style  # its parameters through their module, and its forward hooked
    model = holder(plan)
    axes = ("fsdp", "tp")
    run = Run(tp=4, fsdp=2)
    model._mesh_manager = meshes(run)  # 5.25's unit styles build their mesh from it
    tp = meshes(run).get_mesh("tp")
    expanded = DistributedMixin._expand_parallel_plan(model, plan)  # type: ignore[arg-type]  # a duck model
    try:
        sharding = plan_from_hf(model, ep_axis=None, mesh_axes=axes)
    except PlanError as e:
        problems = {p.fqn or "": p.message for p in e.problems}
        if any("cannot apply" in m for m in problems.values()):
            # an expert-parallel style transformers' tensor parallelism cannot call (5.25:
            # any; 5.24: ep_dispatch_experts on a module, whose hook needs the ep mesh)
            assert all(
                m.endswith("put the rule in the ep_plan, or drop it") for m in problems.values()
            )
            with pytest.raises(TypeError):
                apply_tensor_parallelism(model, tp, expanded)
            return
        if style not in UNIT_STYLES:
            # a dim the parameter lacks (S(1) of a bias): transformers fails on it too
            assert all("which it does not have" in m for m in problems.values())
            with pytest.raises(IndexError):
                apply_tensor_parallelism(model, tp, expanded)
            return
        # what a unit style splits goes to a mesh of transformers' own, not the tp mesh;
        # what it leaves whole (unit_rowwise's bias) is whole on every rank, as R says
        assert all("puts it on a mesh of its own" in m for m in problems.values())
        apply_tensor_parallelism(model, tp, expanded)
        for fqn, param in model.named_parameters():
            assert isinstance(param, DTensor), fqn
            assert param.device_mesh.mesh_dim_names == ("tp", "unit_replicate"), fqn
            whole = all(p.is_replicate() for p in param.placements)
            assert whole == (fqn not in problems), fqn
        assert sorted(problems) == sorted(
            fqn
            for fqn, _ in model.named_parameters()
            if style == "unit_colwise" or not fqn.endswith(".bias")
        )
        return
    table = build_table(sharding, dense_axes=axes)
    expected = complete_default(table, fqns(model), axes, plain=True)
    apply_tensor_parallelism(model, tp, expanded)
    assert table_from_module(model) == expected


@pytest.mark.parametrize("version", ["5.24.0", "4.57.1", "5.24.0.dev0", "5.25.0", "unknown", None])
def test_the_transformers_imported_chooses_the_styles(
    monkeypatch: pytest.MonkeyPatch, version: str | None
) -> None:
    """The styles read are those of the release ``transformers.__version__`` names, or of
    the newest known when it names none or transformers is not imported: 5.24's know
    ``moe_identity_expert`` and no unit style, 5.25's the other way round."""
    plan = {"probe.weight": "moe_identity_expert", "probe.bias": "colwise", "lin": "unit_rowwise"}
    old = {"probe.weight": "moe_identity_expert", "probe.bias": "colwise"}
    new = {"probe.bias": "colwise", "lin.bias": "unit_rowwise"}
    models = {"plan": holder(plan), "old": holder(old), "new": holder(new)}  # before unloading
    if version is None:
        monkeypatch.delitem(sys.modules, "transformers")
    else:  # the module plan_from_hf reads (importing a model class may replace it)
        monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    release = "5.24" if version is not None and version[:4] in {"5.24", "4.57"} else "5.25"
    with pytest.raises(PlanError) as caught:
        plan_from_hf(models["plan"], ep_axis=None, mesh_axes=["tp"])
    messages = [p.message for p in caught.value.problems]
    known = ", ".join(sorted(STYLES_BY_RELEASE[(5, 24) if release == "5.24" else (5, 25)]))
    if release == "5.24":
        assert messages == [
            f"model.tp_plan['lin']: style 'unit_rowwise' is not one transformers 5.24 "
            f"registers (known: {known}); fix the style name, or plan these parameters by hand"
        ]
        read = models["old"]
        expected = {"probe.bias": "dense[tp=S(0)]"}  # moe_identity_expert: hooks only
    else:
        assert messages == [
            f"model.tp_plan['probe.weight']: style 'moe_identity_expert' is not one "
            f"transformers 5.25 registers (known: {known}); transformers 5.25 removed it, and "
            "its MoE plans shard experts by expert: 'ep_dispatch_experts' and 'grouped_gemm' "
            "in the ep_plan; fix the rule, or plan these parameters by hand",
            "lin.weight: style 'unit_rowwise' (tp_plan['lin']) puts it on a mesh of its own "
            "that transformers 5.25 builds from its 3 heads: the ranks of 'tp' in gcd(heads, "
            "tp size) groups of whole heads, every rank of a group holding the same ones, "
            "which no placement on 'tp' says; pass tp_size=... (the tp size): when it "
            "divides 3, each rank holds the rows 'rowwise' gives it, and the weight is read so",
        ]
        read = models["new"]
        expected = {"probe.bias": "dense[tp=S(0)]", "lin.bias": "dense[tp=R]"}
    table = build_table(plan_from_hf(read, ep_axis=None, mesh_axes=["tp"]), ["tp"])
    assert {fqn: str(layout) for fqn, layout in table.items()} == expected


UNIT_PLAN = {
    "model.layers.*.self_attn.q_proj": "unit_colwise",  # 4 heads over tp=4: one each
    "model.layers.*.self_attn.k_proj": "unit_colwise",  # 2 heads over tp=4: each on 2 ranks
    "model.layers.*.self_attn.v_proj": "unit_colwise",
    "model.layers.*.self_attn.o_proj": "unit_rowwise",  # 4 heads, in its columns
}
"""Llama's attention by heads, as 5.25's MiniCPM5-MoE plans its keys and values."""


def rank_blocks(param: DTensor, ranks: list[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (local shape, global offset) of ``param`` on each of ``ranks``, as DTensor
    computes them on the mesh the parameter is on."""
    mesh = param.device_mesh.mesh
    blocks = []
    for rank in ranks:
        coordinate = [int(i) for i in (mesh == rank).nonzero()[0]]
        shape, offset = _compute_local_shape_and_global_offset(
            tuple(param.shape), tuple(mesh.shape), coordinate, list(param.placements)
        )
        blocks.append((tuple(shape), tuple(offset)))
    return blocks


def test_unit_styles_put_heads_on_a_mesh_of_their_own() -> None:
    """5.25's unit styles give each tp rank whole heads, on a mesh transformers builds:
    the rows ``colwise`` (``rowwise``) gives when the tp size divides the head count, but
    2 heads over 4 ranks give each head to two ranks, which no placement on tp says. So
    each such weight is refused, naming the style to read instead. 5.24 has no unit
    style: it refuses them, and so does ``plan_from_hf`` under it."""
    run = Run(tp=4, fsdp=2)
    model = llama()
    model._tp_plan = {**model.tp_plan, **UNIT_PLAN}
    with pytest.raises(PlanError) as caught:
        run.plan(model)
    problems = {p.fqn or "": p.message for p in caught.value.problems}
    if installed() < (5, 25):
        assert list(problems) == list(UNIT_PLAN)
        assert all("is not one transformers 5.24 registers" in m for m in problems.values())
        with pytest.raises(ValueError, match=r"Unsupported `tp_plan` styles: \{'unit_"):
            model._resolve_parallel_plans(run.config())
        return
    weights = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"]
    assert sorted(problems) == sorted(weights)
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    assert problems[k_proj].startswith(
        f"{k_proj}: style 'unit_colwise' (tp_plan['model.layers.*.self_attn.k_proj']) puts it "
        "on a mesh of its own that transformers 5.25 builds from its 2 heads: "
    )
    assert problems[k_proj].endswith(
        "pass tp_size=... (the tp size): when it divides 2, each rank holds the rows 'colwise' "
        "gives it, and the weight is read so"
    )
    # The remedy read against transformers' own unit styles, rank by rank.
    remedy = llama()
    remedy._tp_plan = {**remedy.tp_plan, **{k: v[5:] for k, v in UNIT_PLAN.items()}}
    ours = run.predicted(remedy)
    transformers_tp_ep(model, run)
    theirs = table_from_module(model)
    ranks = meshes(run).get_mesh("tp").mesh.tolist()
    for fqn, param in model.named_parameters():
        if fqn not in problems:
            assert theirs[fqn] == ours[fqn], fqn
            continue
        assert isinstance(param, DTensor)
        mine = [
            local_shape_and_offset(param.shape, ours[fqn], {"tp": 4}, {"tp": i})
            for i in range(len(ranks))
        ]
        divides = ".k_proj." not in fqn and ".v_proj." not in fqn  # 4 heads, not 2
        assert (rank_blocks(param, ranks) == mine) == divides, fqn
    # 2 heads of 8 rows over 4 ranks: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1
    k_weight = model.get_parameter(k_proj)
    assert isinstance(k_weight, DTensor)
    assert rank_blocks(k_weight, ranks) == [((8, 32), (r, 0)) for r in (0, 0, 8, 8)]


def test_unit_styles_read_with_the_tp_size_when_it_divides_the_heads() -> None:
    """Given ``tp_size``, a unit-styled weight whose heads the tp size divides reads as its
    plain style, rank by rank what transformers 5.25 gives it; one whose heads it does not
    divide is still refused, and says so. 5.24 registers no unit style."""
    run = Run(tp=4, fsdp=2)
    whole = llama_heads(kv_heads=4)  # every projection 4 heads: tp=4 divides them all
    whole._tp_plan = {**whole.tp_plan, **UNIT_PLAN}
    if installed() < (5, 25):
        with pytest.raises(PlanError, match=r"'unit_colwise' is not one transformers 5\.24"):
            plan_from_hf(whole, ep_axis=None, mesh_axes=AXES, tp_size=4)
        return
    plan = plan_from_hf(whole, ep_axis=None, mesh_axes=AXES, tp_size=4)
    table = complete_default(build_table(plan, dense_axes=DENSE), fqns(whole), DENSE, plain=True)
    transformers_tp_ep(whole, run)
    theirs = table_from_module(whole)
    ranks = meshes(run).get_mesh("tp").mesh.tolist()
    unit = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"]
    for fqn, param in whole.named_parameters():
        if fqn not in unit:
            assert theirs[fqn] == table[fqn], fqn
            continue
        assert isinstance(param, DTensor)  # on transformers' unit mesh, (tp, unit_replicate)
        blocks = [
            local_shape_and_offset(param.shape, table[fqn], {"tp": 4}, {"tp": r}) for r in range(4)
        ]
        assert rank_blocks(param, ranks) == blocks, fqn
    assert str(table["model.layers.0.self_attn.k_proj.weight"]) == "dense[tp=S(0)]"
    assert str(table["model.layers.0.self_attn.o_proj.weight"]) == "dense[tp=S(1)]"
    # Llama's 2 key/value heads over tp=4: those weights are refused, saying why
    halves = llama()
    halves._tp_plan = {**halves.tp_plan, **UNIT_PLAN}
    with pytest.raises(PlanError) as caught:
        plan_from_hf(halves, ep_axis=None, mesh_axes=AXES, tp_size=4)
    problems = {p.fqn or "": p.message for p in caught.value.problems}
    kv = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "kv"]
    assert sorted(problems) == sorted(kv)
    assert problems[kv[0]].endswith(
        "builds from its 2 heads: the ranks of 'tp' in gcd(heads, tp size) groups of whole "
        "heads, every rank of a group holding the same ones, which no placement on 'tp' says; "
        "give tp a size that divides 2 (it is 4), or write the ShardingPlan"
    )
    assert plan_from_hf(halves, ep_axis=None, mesh_axes=AXES, tp_size=2).modules == (
        plan_from_hf(whole, ep_axis=None, mesh_axes=AXES, tp_size=4).modules
    )


@pytest.mark.parametrize(
    "size",
    [0, -1, True, 2.0, "4", "", [], [4], 2**21, 2**63, 10**5000],
    ids=["0", "-1", "True", "2.0", "'4'", "''", "[]", "[4]", "2**21", "2**63", "10**5000"],
)
def test_a_tp_size_that_is_no_mesh_size_is_refused(size: object) -> None:
    with pytest.raises(LayoutError, match=r"^plan_from_hf\(tp_size=\.\.\.\): must be the "):
        plan_from_hf(llama(), ep_axis=None, mesh_axes=AXES, tp_size=size)  # type: ignore[arg-type]


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


def test_tensor_axis_without_a_tensor_plan() -> None:
    """An empty tp_plan with tp among the axes: refused here, and by transformers unless
    (from 5.25) ``DistributedConfig(tp_plan={})`` asks for no tensor-parallel rules."""
    from transformers.distributed.configuration_utils import DistributedConfig  # noqa: PLC0415

    model = mixtral()
    model._tp_plan = {}
    with pytest.raises(PlanError) as caught:
        plan_from_hf(model, ep_axis=None, mesh_axes=AXES)
    assert [p.message for p in caught.value.problems] == [
        "tp_axis='tp' is one of mesh_axes, but the model's tp_plan is empty, so it shards "
        "nothing over 'tp' (transformers refuses that size > 1 without a plan, unless "
        "DistributedConfig(tp_plan={}) asks for none (5.25)); pass tp_axis=None when this "
        "run has no such parallelism, or set the model's plan"
    ]
    plan = plan_from_hf(model, tp_axis=None, mesh_axes=AXES)
    assert plan.modules == plan_from_hf(mixtral(), tp_axis=None, mesh_axes=AXES).modules
    table = build_table(plan, dense_axes=DENSE, expert_axes=EXPERT)
    assert table and {str(layout) for layout in table.values()} == {"expert[ep=S(0)]"}
    model = mixtral()
    config = DistributedConfig(tp_size=4, fsdp_size=2, ep_size=4, tp_plan={})
    if installed() < (5, 25):
        with pytest.raises(ValueError, match=r"`tp_size=4` was requested, but"):
            model._resolve_parallel_plans(config)
    else:
        tp_plan, ep_plan, _ = model._resolve_parallel_plans(config)
        assert (tp_plan, bool(ep_plan)) == ({}, True)


def test_styles_transformers_refuses() -> None:
    """A style the release does not register, and a style it refuses in an ep_plan: both
    refused at once, the latter naming what shards experts in that release."""
    release = ".".join(map(str, installed()))
    model = mixtral()
    model._ep_plan = {
        **model.ep_plan,
        "model.layers.*.mlp.experts": "moe_tp_experts",
        "model.layers.*.mlp.gate": "ep_router",
    }
    model._tp_plan = {**model.tp_plan, "model.norm": "shiny"}
    with pytest.raises(PlanError) as caught:
        plan_from_hf(model, mesh_axes=AXES)
    messages = [p.message for p in caught.value.problems]
    assert len(messages) == 3
    assert messages[0].startswith(
        f"model.tp_plan['model.norm']: style 'shiny' is not one transformers {release} "
        "registers (known: all_reduce, "
    )
    for key, style in (("experts", "moe_tp_experts"), ("gate", "ep_router")):
        assert (
            f"model.ep_plan['model.layers.*.mlp.{key}']: style {style!r} does not belong in "
            f"an ep_plan (transformers {release} refuses it); shard the experts by expert: "
            "'ep_dispatch_experts' on the experts module and 'grouped_gemm' on their weights"
        ) in messages
    # transformers' own refusal, whose wording changed in 5.25, names the same remedy
    with pytest.raises(ValueError, match=r"`ep_dispatch_experts` and\s+`grouped_gemm`"):
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
        LayoutError, match=r"plan_from_hf\(model=\.\.\.\): must be a torch.nn.Module"
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
    for odd in (["probe.weight"], {"probe.weight": 1}, None):
        model.all_tied_weights_keys = {"probe.weight": odd}  # type: ignore[dict-item]
        with pytest.raises(PlanError, match=r"must map parameter names to parameter names"):
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


def test_unit_styles_with_fsdp_are_problems_as_transformers_fails() -> None:
    """A unit style's weight sits on a (tp, unit_replicate) mesh transformers builds apart
    from its meshes: its own FSDP cannot compose it, whatever the tp size. With ``fsdp``
    each such weight is a problem saying so; without, the layout as before."""
    if installed() < (5, 25):
        pytest.skip("5.24 registers no unit style")
    run = Run(tp=4, fsdp=2)
    unit = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"]

    def heads_whole() -> PreTrainedModel:
        model = llama_heads(kv_heads=4)  # tp=4 divides every projection's heads
        model._tp_plan = {**model.tp_plan, **UNIT_PLAN}
        return model

    plan = plan_from_hf(heads_whole(), ep_axis=None, mesh_axes=AXES, tp_size=4)
    assert {fqn for fqn, _, _ in plan.named_placements()} >= set(unit)
    with pytest.raises(PlanError) as caught:
        plan_from_hf(heads_whole(), ep_axis=None, mesh_axes=AXES, tp_size=4, fsdp=True)
    problems = {p.fqn or "": p.message for p in caught.value.problems}
    assert sorted(problems) == sorted(unit)
    assert "(tp, unit_replicate) mesh" in problems[unit[1]]
    assert problems[unit[1]].endswith(
        "run it without FSDP (fsdp=False), or give the rule the style 'colwise' "
        "(DistributedConfig(tp_plan={...}))"
    )
    # transformers' own FSDP fails on the same model, as the problem says
    with pytest.raises(RuntimeError, match="Cannot concatenate DeviceMeshes"):
        transformers_all(heads_whole(), run)
    with pytest.raises(LayoutError, match=r"plan_from_hf\(fsdp=\.\.\.\): must be True or False"):
        plan_from_hf(heads_whole(), ep_axis=None, mesh_axes=AXES, fsdp="yes")  # type: ignore[arg-type]
