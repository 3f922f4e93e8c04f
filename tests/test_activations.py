"""``Activations`` and ``torch_bridge.activations_from_module``: the bytes autograd saves
per unit, traced on fake tensors, equal to what the same forward saves on real CPU
tensors under the same saved-tensor hooks, and, with ``checkpointing="full"``, to what
torch's own ``checkpoint_wrapper`` around each block leaves saved.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils._pytree import tree_leaves

from layout_algebra import (
    Activations,
    LayoutError,
    ParamLayoutTable,
    ParamShape,
    SerializationError,
    Shard,
    SourceLayout,
    Training,
    compose_table,
)
from layout_algebra._json_read import load
from layout_algebra.activations import (
    KINDS,
    activations_from_obj,
    activations_to_obj,
    split_activations,
)
from layout_algebra.serialization import converter
from layout_algebra.torch_bridge import activations_from_module
from layout_algebra.torch_bridge.activations import _Call, calls_of, compose, trace
from layout_algebra.training import training_cost
from tests.models import hf_llama, hf_moe, on_cpu
from tests.torch_oracle import MeshFactory

BATCH, SEQ = 2, 6


def value() -> Activations:
    return Activations(
        units={"": {"fixed": 8}, "layers.0": {"sequence": 64, "heads": 512, "experts": 96}},
        batch=2,
        seq_len=8,
        checkpointing="full",
        recompute={"layers.0": 1024},
    )


# ---------------------------------------------------------------------------------------
# the value


def test_every_unit_lists_every_kind_in_order() -> None:
    acts = value()
    assert list(acts.units["layers.0"]) == list(KINDS)
    assert acts.units[""] == {"sequence": 0, "heads": 0, "experts": 0, "fixed": 8}
    assert acts.total == 8 + 64 + 512 + 96
    assert acts.recompute_peak == 1024


def test_held_divides_each_kind_as_its_sharding_does() -> None:
    acts = value()
    # tp=2, cp=2: heads 512 / 4 = 128, sequence 64 / 2 = 32 (whole on each tp rank),
    # experts 96 / 2 = 48 (ep leaves a rank as many routed tokens), fixed 8
    assert acts.held(tp=2, cp=2) == 128 + 32 + 48 + 8
    # under sequence parallelism the sequence is cut over tp too: 64 / 4 = 16
    assert acts.held(tp=2, cp=2, sequence_parallel=True) == 128 + 16 + 48 + 8
    assert acts.held() == acts.total
    # rounded up per unit and kind: 64 / 3 -> 22, 512 / 3 -> 171, 96 -> 96
    assert acts.held(tp=3) == 171 + 64 + 96 + 8


def test_json_round_trip_through_the_converter() -> None:
    acts = value()
    obj = converter.unstructure(acts)
    assert obj == {
        "units": {
            "": {"sequence": 0, "heads": 0, "experts": 0, "fixed": 8},
            "layers.0": {"sequence": 64, "heads": 512, "experts": 96, "fixed": 0},
        },
        "batch": 2,
        "seq_len": 8,
        "checkpointing": "full",
        "recompute": {"layers.0": 1024},
        "boundary": 0,
        "modules": {},
        "routed": {},
    }
    back = converter.structure(obj, Activations)
    assert back == acts
    assert hash(back) == hash(acts)


@pytest.mark.parametrize(
    ("obj", "where"),
    [
        ({"units": {"a": {"tokens": 1}}, "batch": 1, "seq_len": 1}, 'units["a"]'),
        ({"units": {"a": {"heads": -1}}, "batch": 1, "seq_len": 1}, 'units["a"]'),
        ({"units": {}, "batch": 0, "seq_len": 1}, "batch"),
        ({"units": {}, "batch": 1, "seq_len": 1, "checkpointing": "some"}, "checkpointing"),
        ({"units": {}, "batch": 1, "seq_len": 1, "recompute": {"x": 1}}, "$"),
        ({"units": {}, "batch": 1}, "seq_len"),
        ({"units": {}, "batch": 1, "seq_len": 1, "extra": 1}, "extra"),
        ([], "$"),
    ],
)
def test_bad_json_names_its_path(obj: object, where: str) -> None:
    with pytest.raises(SerializationError) as info:
        converter.structure(obj, Activations)
    assert info.value.message.startswith(where)


def test_bad_values_are_layout_errors_naming_the_argument() -> None:
    with pytest.raises(LayoutError, match="needs the argument 'seq_len'"):
        Activations(units={}, batch=1)  # type: ignore[call-arg]  # what is tested
    with pytest.raises(LayoutError, match=r"checkpointing=\.\.\.\) must be one of"):
        Activations(units={}, batch=1, seq_len=1, checkpointing="half")
    with pytest.raises(LayoutError, match="has the kind 'tokens'"):
        Activations(units={"a": {"tokens": 1}}, batch=1, seq_len=1)
    with pytest.raises(LayoutError, match="names the unit 'b'"):
        Activations(units={"a": {}}, batch=1, seq_len=1, recompute={"b": 0})
    with pytest.raises(LayoutError, match=r"held\(tp=\.\.\.\)"):
        value().held(tp=0)


def test_str_lists_the_units() -> None:
    text = str(value())
    assert text.splitlines()[0] == (
        "activations of one microbatch (2 x 8 tokens, checkpointing 'full'): 680 B held, "
        "1.00 KiB more in one unit's backward"
    )
    assert "  layers.0: sequence 64 B, heads 512 B, experts 96 B" in text


def test_the_strict_readers_json_reads_and_a_key_given_twice_is_refused() -> None:
    """What a file holds, as the package's strict reader gives it (pairs, not dicts)."""
    text = json.dumps(activations_to_obj(value()))
    assert activations_from_obj(load(text)) == value()
    with pytest.raises(SerializationError, match="'batch' appears twice"):
        activations_from_obj(load('{"units": {}, "batch": 1, "batch": 2, "seq_len": 1}'))


def test_split_puts_each_entry_in_its_part_and_keeps_the_rest() -> None:
    acts = Activations(
        units={"": {"fixed": 8}, "a": {"sequence": 4}, "b,c": {"heads": 2}},
        batch=2,
        seq_len=8,
        checkpointing="full",
        recompute={"a": 16, "b,c": 32},
        boundary=64,
        modules={"a.w": ("linear", 1, 2), "b.w": ("embedding", 3, 4)},
        routed={"b.experts": 5},
    )
    first, second = split_activations(acts, lambda name: int(name.startswith("b")), 2)
    assert first == Activations(
        units={"": {"fixed": 8}, "a": {"sequence": 4}},
        batch=2,
        seq_len=8,
        checkpointing="full",
        recompute={"a": 16},
        boundary=64,
        modules={"a.w": ("linear", 1, 2)},
    )
    assert second == Activations(
        units={"b,c": {"heads": 2}},
        batch=2,
        seq_len=8,
        checkpointing="full",
        recompute={"b,c": 32},
        boundary=64,
        modules={"b.w": ("embedding", 3, 4)},
        routed={"b.experts": 5},
    )


@pytest.mark.parametrize(("tp", "ep", "sent"), [(2, 2, 4 * 100), (2, 1, 0), (1, 2, 4 * 100)])
def test_experts_exchange_over_ep_whatever_tp_shards(tp: int, ep: int, sent: int) -> None:
    """Per-expert projections sharded over ep alone beside a dense one sharded over tp:
    the experts module dispatches and combines its routed bytes, forward and backward,
    exactly when ep has several ranks (the dense projection's tp says nothing of it)."""
    table = ParamLayoutTable(
        {
            "layers.0.attn.q.weight": SourceLayout("dense", ["tp"], [Shard(0)]),
            "layers.0.experts.0.w.weight": SourceLayout("expert", ["ep"], [Shard(0)]),
        }
    )
    shapes = {fqn: ParamShape((8, 8), "float32") for fqn in table}
    sizes = {"dense": {"dp_shard": 2 * ep, "tp": tp}, "expert": {"dp_shard": 2 * tp, "ep": ep}}
    composed = compose_table(
        table, fsdp={"dense": "dp_shard", "expert": "dp_shard"}, mesh_sizes=sizes
    )
    acts = Activations(
        units={"": {"sequence": 8}},
        batch=1,
        seq_len=4,
        modules={"layers.0.attn.q": ("linear", 64, 64), "layers.0.experts.0.w": ("linear", 64, 64)},
        routed={"layers.0.experts": 100},
    )
    cost = training_cost(dict(composed.items()), shapes, sizes, Training(activations=acts))
    assert set(cost.traffic["ep_all_to_all"]) == {sent}
    assert set(cost.traffic["tp"]) == {64 if tp > 1 else 0}


# ---------------------------------------------------------------------------------------
# traced, against torch on the CPU


def _titan(models: str, configs: str, name: str) -> nn.Module:
    """A torchtitan debug model, two layers, on the meta device, with torchtitan's own
    SDPA inner attention: its flex attention refuses a backward on the CPU."""
    module = pytest.importorskip(models)
    attention = pytest.importorskip("torchtitan.models.common.attention")
    cfg = getattr(module, configs)[name](attn_backend="flex")
    object.__setattr__(cfg, "layers", cfg.layers[:2])  # slotted dataclass
    for layer in cfg.layers:
        inner = attention.ScaledDotProductAttention.Config()
        object.__setattr__(layer.attention, "inner_attention", inner)
    with torch.device("meta"):
        built = cfg.build()
    assert isinstance(built, nn.Module)
    return built


def titan_llama() -> nn.Module:
    """torchtitan's llama3 debug model (``_titan``)."""
    return _titan("torchtitan.models.llama3", "llama3_configs", "debugmodel")


def titan_moe() -> nn.Module:
    """torchtitan's Qwen3-MoE debug model (``_titan``), in bfloat16 (as FSDP2's mixed
    precision gathers it: its experts cast their weights to bfloat16, and would save
    float32 weights' copies)."""
    built = _titan("torchtitan.models.qwen3", "qwen3_configs", "debugmodel_moe")
    return built.to(torch.bfloat16)


def moe_bf16() -> nn.Module:
    """transformers' Qwen3-MoE in bfloat16: torch's grouped matmul takes no other dtype
    on the meta device."""
    model: nn.Module = hf_moe()
    return model.to(torch.bfloat16)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "hf-llama": hf_llama,
    "hf-qwen3-moe": moe_bf16,
    "titan-llama3": titan_llama,
    "titan-qwen3-moe": titan_moe,
}

pytestmark = [
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    # torchtitan's router asks CPU autocast for float32, which it declines (and so runs as is)
    pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported"),
]


def real(model: nn.Module, calls_from: nn.Module) -> Activations:
    """What ``model``'s forward saves on the CPU under the tracer's hooks, per unit of
    ``calls_from`` (its module names)."""
    calls = calls_of(calls_from, "none")
    traced = trace(model, calls, batch=BATCH, seq_len=SEQ, fake=False)
    return compose(traced, calls, batch=BATCH, seq_len=SEQ, checkpointing="none")


@pytest.mark.parametrize("name", MODELS)
def test_traced_bytes_equal_the_real_forward(name: str) -> None:
    make = MODELS[name]
    traced = activations_from_module(make(), batch=BATCH, seq_len=SEQ)
    model = on_cpu(make())
    assert real(model, model).units == traced.units
    assert traced.total > 0
    assert any(kinds["heads"] for kinds in traced.units.values())


@pytest.mark.parametrize("name", MODELS)
def test_full_checkpointing_equals_torch_checkpoint_per_block(name: str) -> None:
    make = MODELS[name]
    traced = activations_from_module(make(), batch=BATCH, seq_len=SEQ, checkpointing="full")
    none = activations_from_module(make(), batch=BATCH, seq_len=SEQ)
    model = on_cpu(make())
    plain = on_cpu(make())
    blocks = [fqn for fqn, call in calls_of(model, "full").items() if call.checkpointed]
    assert len(blocks) == 2
    for fqn in blocks:
        parent, _, child = fqn.rpartition(".")
        owner = model.get_submodule(parent)
        owner.register_module(child, checkpoint_wrapper(owner.get_submodule(child)))
    assert real(model, plain).units == traced.units
    assert set(traced.recompute) == set(blocks)
    # a block's backward saves again what it saved without checkpointing (its input aside)
    for fqn in blocks:
        assert 0 < traced.recompute[fqn] <= sum(none.units[fqn].values())
    assert traced.total < none.total


def kept_by_torchtitan(
    make: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch
) -> dict[str, int]:
    """Per block, the bytes torchtitan's own ``SelectiveAC`` keeps on the CPU: the
    block's inputs (saved by torch's checkpoint, seen by the hooks) and the op outputs
    its selective-checkpoint cache holds, each storage once.

    Its save list is torchtitan's with the CPU's flash attention added (the extension
    point it offers, ``get_save_ops``): the GPU's flash attention is on it, and the CPU
    runs its own instead."""
    ac = pytest.importorskip("torchtitan.distributed.activation_checkpoint")
    caches: list[dict[object, dict[int, object]]] = []
    make_contexts = ac.create_selective_checkpoint_contexts

    def recording(policy: object) -> tuple[object, object]:
        contexts: tuple[Any, Any] = make_contexts(policy)
        caches.append(contexts[0].storage)  # one per block's forward, in order
        return contexts

    monkeypatch.setattr(ac, "create_selective_checkpoint_contexts", recording)

    selective: Any = ac.SelectiveAC

    class CpuFlash(selective):  # type: ignore[misc]  # torchtitan is untyped here
        def get_save_ops(self) -> set[object]:
            cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
            return {*super().get_save_ops(), cpu}

    policy = CpuFlash(CpuFlash.Config())
    model, plain = on_cpu(make()), on_cpu(make())
    blocks = [fqn for fqn, call in calls_of(plain, "selective").items() if call.checkpointed]
    for fqn in blocks:
        parent, _, child = fqn.rpartition(".")
        owner = model.get_submodule(parent)
        owner.register_module(child, policy._wrap_block(owner.get_submodule(child), base_fqn=fqn))
    events = trace(model, calls_of(plain, "none"), batch=BATCH, seq_len=SEQ, fake=False).events
    assert len(caches) == len(blocks)
    kept: dict[str, int] = {}
    for fqn, cache in zip(blocks, caches, strict=True):
        found = {e.key: e.nbytes for e in events if e.call == fqn}
        for entries in cache.values():
            for entry in entries.values():
                for leaf in tree_leaves(entry):
                    tensor = getattr(leaf, "val", None)  # torch's _VersionWrapper
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        found[storage._cdata] = storage.nbytes()
        kept[fqn] = sum(found.values())
    return kept


@pytest.mark.parametrize("name", MODELS)
def test_selective_equals_torchtitans_policy_per_block(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make = MODELS[name]
    traced = activations_from_module(make(), batch=BATCH, seq_len=SEQ, checkpointing="selective")
    kept = kept_by_torchtitan(make, monkeypatch)
    assert {fqn: sum(traced.units[fqn].values()) for fqn in kept} == kept


def test_a_checkpointed_blocks_rerun_counts_its_projections_outputs_again() -> None:
    """A checkpointed block's backward reruns its forward until autograd has saved the
    block's last tensor (``torch.utils.checkpoint`` stops early there): every projection
    of a Llama block runs twice but ``down_proj``, whose input is the last tensor saved,
    and its output is counted again (what a row-wise projection all-reduces again; the
    whole-step gloo oracle measures it). Inputs, and what is outside the blocks, stay."""
    none = activations_from_module(hf_llama(), batch=BATCH, seq_len=SEQ)
    full = activations_from_module(hf_llama(), batch=BATCH, seq_len=SEQ, checkpointing="full")
    assert set(full.modules) == set(none.modules)
    for name, (kind, given, made) in none.modules.items():
        again = name.startswith("model.layers.") and not name.endswith(".mlp.down_proj")
        assert full.modules[name] == (kind, given, made * (2 if again else 1)), name


def test_routed_rows_count_each_token_top_k_times() -> None:
    """transformers hands its experts (tokens, dim) rows beside (tokens, k) indices;
    torchtitan (batch, seq, dim) beside (batch, seq, k): each token's row counts k times
    either way (bfloat16, 2 bytes a value)."""
    hf: Any = moe_bf16()
    titan: Any = titan_moe()
    router = titan.layers["0"].moe.router
    cases = {
        "model.layers.0.mlp.experts": (hf, hf.config.num_experts_per_tok, hf.config.hidden_size),
        "layers.0.moe.routed_experts": (titan, router.top_k, router.gate.in_features),
    }
    for fqn, (model, k, dim) in cases.items():
        routed = activations_from_module(model, batch=BATCH, seq_len=SEQ).routed
        assert routed[fqn] == BATCH * SEQ * k * dim * 2, fqn


@pytest.mark.parametrize("name", MODELS)
def test_selective_lies_between_full_and_none(name: str) -> None:
    make = MODELS[name]
    totals = {
        policy: activations_from_module(make(), batch=BATCH, seq_len=SEQ, checkpointing=policy)
        for policy in ("none", "selective", "full")
    }
    assert totals["full"].total < totals["selective"].total < totals["none"].total
    assert totals["selective"].recompute_peak > 0


def saved_per_rank(model: nn.Module, calls: Mapping[str, _Call]) -> dict[str, int]:
    """Per unit, the bytes of the distinct storages autograd saves on this rank in one
    forward of ``model`` (its parameters DTensors): a DTensor counted by its local
    shard, parameters left out. Hooks of its own: an oracle beside the tracer."""
    params = {
        (p._local_tensor if isinstance(p, DTensor) else p).untyped_storage()._cdata
        for p in [*model.parameters(), *model.buffers()]
    }
    running = [""]

    def enter(name: str) -> Callable[[nn.Module, object], None]:
        return lambda module, args: running.append(name)

    def leave(module: nn.Module, args: object, output: object) -> None:
        running.pop()  # a forward hook's None keeps the module's output

    for fqn, module in model.named_modules():
        if fqn in calls:
            module.register_forward_pre_hook(enter(calls[fqn].name))
            module.register_forward_hook(leave)
    saved: dict[int, tuple[str, int]] = {}
    kept: list[object] = []  # storages alive until counted: no key reused

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        if storage._cdata not in params and storage._cdata not in saved:
            saved[storage._cdata] = (running[-1], storage.nbytes())
            kept.append(storage)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.zeros((BATCH, SEQ), dtype=torch.long))
    out: dict[str, int] = {}
    for unit, nbytes in saved.values():
        out[unit] = out.get(unit, 0) + nbytes
    return out


def llama_two_kv() -> nn.Module:
    """transformers' Llama with two KV heads: one query and one KV head a TP rank."""
    return hf_llama(num_key_value_heads=2)


def moe_two_kv() -> nn.Module:
    """transformers' Qwen3-MoE in bfloat16 with two KV heads."""
    model: nn.Module = hf_moe(num_key_value_heads=2)
    return model.to(torch.bfloat16)


LAYERS = "model.layers.*"
ATTENTION: dict[str, ParallelStyle] = {
    **{f"{LAYERS}.self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
    f"{LAYERS}.self_attn.o_proj": RowwiseParallel(),
}
TP_RUNS: dict[str, tuple[Callable[[], nn.Module], dict[str, ParallelStyle]]] = {
    "hf-llama": (
        llama_two_kv,
        {
            **ATTENTION,
            f"{LAYERS}.mlp.gate_proj": ColwiseParallel(),
            f"{LAYERS}.mlp.up_proj": ColwiseParallel(),
            f"{LAYERS}.mlp.down_proj": RowwiseParallel(),
        },
    ),
    # attention over tp, the experts left whole: their routed tokens are not divided
    "hf-qwen3-moe": (moe_two_kv, ATTENTION),
}


@pytest.mark.parametrize("name", TP_RUNS)
def test_held_under_tensor_parallelism_equals_a_real_tp_run(
    name: str, world_mesh: MeshFactory
) -> None:
    """The model under torch's own Megatron-style plan (q, k, v, gate and up
    column-wise; o and down row-wise) on two TP ranks of the fake world: what one rank
    saves equals ``held(tp=2)``, unit by unit."""
    make, plan = TP_RUNS[name]
    traced = activations_from_module(make(), batch=BATCH, seq_len=SEQ)
    model = on_cpu(make())
    parallelize_module(model, world_mesh({"dp_shard": 4, "tp": 2})["tp"], plan)
    real = saved_per_rank(model, calls_of(make(), "none"))
    predicted = {
        unit: Activations(units={unit: kinds}, batch=BATCH, seq_len=SEQ).held(tp=2)
        for unit, kinds in traced.units.items()
        if any(kinds.values())
    }
    assert real == predicted
    assert traced.held(tp=2) < traced.total


def test_the_model_is_left_as_it_was() -> None:
    model = hf_llama()
    before = {n: (p.device, p.shape) for n, p in model.named_parameters()}
    activations_from_module(model, batch=1, seq_len=4, checkpointing="selective")
    assert {n: (p.device, p.shape) for n, p in model.named_parameters()} == before
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_bad_arguments_are_refused() -> None:
    model = hf_llama()
    with pytest.raises(LayoutError, match=r"batch=\.\.\.\) must be an int"):
        activations_from_module(model, batch=0, seq_len=4)
    with pytest.raises(LayoutError, match=r"checkpointing=\.\.\.\) must be one of"):
        activations_from_module(model, batch=1, seq_len=4, checkpointing="some")
    with pytest.raises(LayoutError, match="forward failed on fake tensors"):
        activations_from_module(nn.Linear(3, 3), batch=1, seq_len=4)
