"""The toy models the tests lay out, small enough to build on any device in no time.

Only parameters matter to a layout, so the models have no ``forward``. Build them on the
meta device when no data is needed (``with torch.device("meta"): TinyMoE()``).

- :class:`OneParam`: one parameter ``w`` of any shape.
- :class:`TiedTP`: an embedding tied to its head, a column-wise and a row-wise linear with
  biases; optionally a plain norm and 3-D experts.
- :class:`ToyModel`: a tied embedding and head, attention-like linears, a norm and
  (optionally) a 3-D expert weight per block.
- :class:`TinyLlama`: Llama-like dense blocks (torchtitan's names); :class:`TinyMoE`: the
  demo's model (the same attention with a router and 3-D experts, its LM head tied to
  the embedding), whose parts the dense model shares.
  Both take :class:`Sizes`, whose vocabulary (37) splits evenly over no mesh axis.
- :func:`hf_llama` and :func:`hf_moe`: transformers' own Llama and Qwen3-MoE, tiny, on
  the meta device, for tests of their ``tp_plan``/``ep_plan``.
- :func:`param_values`: a model's values by FQN, to compare it with once laid out;
  :func:`on_cpu`: a meta model given real CPU tensors of small values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from layout_algebra import ModulePlan, Placement, Shard, ShardingPlan
from layout_algebra._demo import Attention, DemoConfig, RMSNorm, TinyMoE
from layout_algebra._demo import Block as MoEBlock

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "Attention",
    "LlamaBlock",
    "MoEBlock",
    "OneParam",
    "Sizes",
    "TiedExperts",
    "TiedTP",
    "TinyLlama",
    "TinyMoE",
    "ToyBlock",
    "ToyModel",
    "hf_llama",
    "hf_moe",
    "llama_plan",
    "moe_plan",
    "on_cpu",
    "param_values",
]


def param_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's values by FQN (each alias too), cloned: what a test compares the
    model with after laying it out."""
    return {fqn: p.detach().clone() for fqn, p in model.named_parameters(remove_duplicate=False)}


def on_cpu(model: nn.Module) -> nn.Module:
    """``model`` (on the meta device) with real CPU tensors of small values, tied weights
    tied again: the bytes a step saves or moves do not depend on the values."""
    model.to_empty(device="cpu")
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.02)
        for b in model.buffers():
            b.fill_(0.5)
    return model


class OneParam(nn.Module):
    """One parameter ``w`` of ``shape``, random (or empty on the meta device)."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(*shape))


class TiedExperts(nn.Module):
    """``w1`` (experts, 8, 6) and ``w2`` (experts, 6, 8)."""

    def __init__(self, experts: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, 8, 6))
        self.w2 = nn.Parameter(torch.randn(experts, 6, 8))


class TiedTP(nn.Module):
    """An embedding of ``vocab`` rows tied to its head, a column-wise linear ``up`` (8 to
    ``hidden``) and a row-wise ``down`` back, both with biases; optionally a plain
    ``norm`` (8,) and ``experts`` (:class:`TiedExperts`).

    In ``named_parameters`` order: ``emb.weight``, ``up.weight``, ``up.bias``,
    ``down.weight``, ``down.bias``, [``norm``], [``experts.w1``, ``experts.w2``],
    ``head.weight`` (the embedding's).
    """

    experts: TiedExperts

    def __init__(
        self, *, vocab: int = 12, hidden: int = 16, norm: bool = False, experts: int = 0
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.up = nn.Linear(8, hidden)
        self.down = nn.Linear(hidden, 8)
        if norm:
            self.norm = nn.Parameter(torch.randn(8))
        if experts:
            self.experts = TiedExperts(experts)
        self.head = nn.Linear(8, vocab, bias=False)
        self.head.weight = self.emb.weight


# ---------------------------------------------------------------------------------------
# ToyModel: emb, layers.{i}.{attn.wq, attn.wo, experts.w1, norm}, head (tied to emb)


class ToyAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(8, 16, bias=False)
        self.wo = nn.Linear(16, 8, bias=False)


class ToyExperts(nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, 8, 6))


class ToyBlock(nn.Module):
    """``attn.wq`` (16, 8), ``attn.wo`` (8, 16), ``experts.w1`` (experts, 8, 6), ``norm`` (8,)."""

    experts: ToyExperts

    def __init__(self, experts: int) -> None:
        super().__init__()
        self.attn = ToyAttention()
        if experts:
            self.experts = ToyExperts(experts)
        self.norm = nn.Parameter(torch.randn(8))


class ToyModel(nn.Module):
    """A tied embedding and head of ``vocab`` rows and ``layers`` blocks of width 8.

    With ``experts=0`` the blocks have no expert weight.
    """

    def __init__(self, *, vocab: int = 32, layers: int = 2, experts: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.layers = nn.ModuleList([ToyBlock(experts) for _ in range(layers)])
        self.head = nn.Linear(8, vocab, bias=False)
        self.head.weight = self.emb.weight

    def block(self, i: int) -> ToyBlock:
        """Block ``i``, typed."""
        found = self.layers[i]
        assert isinstance(found, ToyBlock)
        return found


# ---------------------------------------------------------------------------------------
# Llama-like dense and MoE transformers, torchtitan's parameter names


@attrs.frozen
class Sizes(DemoConfig):
    """The sizes of :class:`TinyLlama` and :class:`TinyMoE` (the demo's model, whose parts
    the dense model shares)."""

    vocab: int = 37
    """Prime, so it splits unevenly over every axis: 37 rows over tp=2 are 19, 18."""


class FeedForward(nn.Module):
    """A gated MLP: ``w1``/``w3`` (hidden, dim) up, ``w2`` (dim, hidden) down."""

    def __init__(self, sizes: Sizes) -> None:
        super().__init__()
        self.w1 = nn.Linear(sizes.dim, sizes.hidden, bias=False)
        self.w2 = nn.Linear(sizes.hidden, sizes.dim, bias=False)
        self.w3 = nn.Linear(sizes.dim, sizes.hidden, bias=False)


class LlamaBlock(nn.Module):
    """Norm, attention, norm, gated MLP."""

    def __init__(self, sizes: Sizes) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(sizes.dim)
        self.attention = Attention(sizes)
        self.ffn_norm = RMSNorm(sizes.dim)
        self.feed_forward = FeedForward(sizes)


class TinyLlama(nn.Module):
    """``tok_embeddings``, ``layers.{i}`` (:class:`LlamaBlock`), ``norm``, ``output`` (untied)."""

    def __init__(self, sizes: Sizes | None = None) -> None:
        super().__init__()
        sizes = sizes or Sizes()
        self.tok_embeddings = nn.Embedding(sizes.vocab, sizes.dim)
        self.layers = nn.ModuleList(LlamaBlock(sizes) for _ in range(sizes.layers))
        self.norm = RMSNorm(sizes.dim)
        self.output = nn.Linear(sizes.dim, sizes.vocab, bias=False)


_COLWISE: dict[str, Placement] = {"tp": Shard(0)}
_ROWWISE: dict[str, Placement] = {"tp": Shard(1)}
_ATTENTION = {"wq.weight": _COLWISE, "wk.weight": _COLWISE, "wv.weight": _COLWISE}


def llama_plan(
    sizes: Sizes | None = None, *, mesh_axes: Sequence[str] = ("dp_shard", "tp")
) -> ShardingPlan:
    """Megatron-style tensor parallelism of :class:`TinyLlama` over ``tp``: column-wise
    ``S(0)`` for the embedding, ``wq wk wv w1 w3`` and the output, row-wise ``S(1)`` for
    ``wo w2``. Norms are not mentioned."""
    sizes = sizes or Sizes()
    modules = {"tok_embeddings": ModulePlan({"weight": _COLWISE})}
    for i in range(sizes.layers):
        modules[f"layers.{i}.attention"] = ModulePlan({**_ATTENTION, "wo.weight": _ROWWISE})
        modules[f"layers.{i}.feed_forward"] = ModulePlan(
            {"w1.weight": _COLWISE, "w2.weight": _ROWWISE, "w3.weight": _COLWISE}
        )
    modules["output"] = ModulePlan({"weight": _COLWISE})
    return ShardingPlan(modules, mesh_axes=mesh_axes)


def moe_plan(
    sizes: Sizes | None = None, *, mesh_axes: Sequence[str] = ("dp_shard", "ep", "tp")
) -> ShardingPlan:
    """:class:`TinyMoE` over ``tp`` and ``ep``: attention as in :func:`llama_plan`, the
    experts ``S(0)`` over ``ep`` (expert-parallel) and their hidden dim over ``tp``; the
    tied embedding and output ``S(0)``. Norms and the router are not mentioned."""
    sizes = sizes or Sizes()
    modules = {"tok_embeddings": ModulePlan({"weight": _COLWISE})}
    for i in range(sizes.layers):
        modules[f"layers.{i}.attention"] = ModulePlan({**_ATTENTION, "wo.weight": _ROWWISE})
        modules[f"layers.{i}.moe"] = ModulePlan(
            {
                "experts.w1": {"ep": Shard(0), "tp": Shard(1)},
                "experts.w2": {"ep": Shard(0), "tp": Shard(2)},
                "experts.w3": {"ep": Shard(0), "tp": Shard(1)},
            },
            expert_parallel=True,
        )
    modules["output"] = ModulePlan({"weight": _COLWISE})
    return ShardingPlan(
        modules, mesh_axes=mesh_axes, tied_pairs=[("tok_embeddings.weight", "output.weight")]
    )


# ---------------------------------------------------------------------------------------
# transformers' own models, tiny, on the meta device


def hf_llama(sizes: Sizes | None = None, **config: Any) -> PreTrainedModel:
    """transformers' ``LlamaForCausalLM`` at these sizes (``dim // kv_dim`` query heads and
    one key/value head, each ``kv_dim`` wide), on the meta device, LM head untied.

    ``config`` overrides or adds ``LlamaConfig`` fields (``num_key_value_heads=2``).
    """
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - slow import

    sizes = sizes or Sizes()
    fields: dict[str, Any] = {
        "vocab_size": sizes.vocab,
        "hidden_size": sizes.dim,
        "intermediate_size": sizes.hidden,
        "num_hidden_layers": sizes.layers,
        "num_attention_heads": sizes.dim // sizes.kv_dim,
        "num_key_value_heads": 1,
        "tie_word_embeddings": False,
    }
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**(fields | config)))


def hf_moe(sizes: Sizes | None = None, **config: Any) -> PreTrainedModel:
    """transformers' ``Qwen3MoeForCausalLM`` at these sizes, every layer sparse (2 of
    ``experts`` per token), on the meta device, the LM head tied to the embedding.

    Its experts are 3-D: ``mlp.experts.gate_up_proj`` (experts, 2 * hidden, dim) and
    ``mlp.experts.down_proj`` (experts, dim, hidden). ``config`` overrides or adds
    ``Qwen3MoeConfig`` fields (``mlp_only_layers=[0]``).
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: PLC0415 - slow import

    sizes = sizes or Sizes()
    fields: dict[str, Any] = {
        "vocab_size": sizes.vocab,
        "hidden_size": sizes.dim,
        "intermediate_size": sizes.hidden,
        "moe_intermediate_size": sizes.hidden,
        "num_hidden_layers": sizes.layers,
        "num_attention_heads": sizes.dim // sizes.kv_dim,
        "num_key_value_heads": 1,
        "num_experts": sizes.experts,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "tie_word_embeddings": True,
    }
    with torch.device("meta"):
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**(fields | config)))
