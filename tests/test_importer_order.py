"""The importers list a model's parameters in module order, the order the model runs in.

The step model follows FSDP units by position in the table: a table listing the
parameters a plan names before the ones it leaves plain (norms) stretched the first
layer's unit over every later one, so the FSDP timeline, and the peak, were read as if
that unit held the others.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel
from transformers import LlamaConfig, LlamaForCausalLM

from layout_algebra import FSDPUnit, Mesh, ParamLayoutTable, Training, lint
from layout_algebra.torch_bridge import shapes_from_module, table_from_hf, table_from_parallelize
from layout_algebra.torch_bridge._walk import named_parameters


def llama(*, tied: bool = True) -> nn.Module:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def test_table_from_hf_is_in_module_order_with_its_ties() -> None:
    model = llama()
    table = table_from_hf(model, mesh_axes=Mesh({"dp_shard": 2, "tp": 2}))
    assert list(table) == [name for name, _ in named_parameters(model)]
    assert [sorted(g) for g in table.tied] == [["lm_head.weight", "model.embed_tokens.weight"]]


def test_table_from_parallelize_is_in_module_order() -> None:
    model = llama()
    plan = {"model.layers.*.self_attn.q_proj": ColwiseParallel()}
    table = table_from_parallelize(model, plan, mesh_axes=("tp",))
    assert list(table) == [name for name, _ in named_parameters(model)]


def test_the_step_of_the_importers_table_is_the_step_of_the_model_order() -> None:
    """What lint says of ``table_from_hf``'s table is what it says of the same layouts
    listed as the model runs them: each layer its own unit, none inside another."""
    model = llama(tied=False)
    mesh = Mesh({"dp_shard": 2, "tp": 2})
    table = table_from_hf(model, mesh_axes=mesh)
    ordered = ParamLayoutTable(
        {name: table[name] for name, _ in named_parameters(model)}, tied=table.tied
    )
    training = Training(units=["model.layers.*", FSDPUnit(["model.norm", "lm_head"])])
    shapes = shapes_from_module(model)
    fsdp = {"dense": "dp_shard"}
    got = lint(table, shapes, mesh_sizes=mesh, fsdp=fsdp, training=training)
    want = lint(ordered, shapes, mesh_sizes=mesh, fsdp=fsdp, training=training)
    assert got.ok, got.problems
    assert got.traffic == want.traffic
    assert got.memory.by_kind == want.memory.by_kind
    assert got.memory.peak == want.memory.peak
