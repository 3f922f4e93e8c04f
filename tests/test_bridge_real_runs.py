"""The bridge's readers on models as real trainers leave them.

torchtitan's default backend (plain local shards with spmd_types records), torch's
activation-checkpoint wrapper, transformers' own meshes and expert parallelism: each read
back as the library made it, the library as the oracle.
"""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor.parallel import ColwiseParallel

from layout_algebra import BindError, LayoutError, build_table
from layout_algebra.torch_bridge import (
    bind,
    distribute,
    plan_from_parallelize,
    shapes_from_module,
    table_from_module,
    tied_pairs_from_module,
)
from tests.torch_oracle import MeshFactory
from tests.torchtitan_runs import Run, Titan, build

pytestmark = [
    pytest.mark.usefixtures("fake_world"),
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


# ---------------------------------------------------------------------------------------
# torchtitan's spmd_types backend: plain local shards are refused, never read as whole


def test_spmd_types_shards_are_refused_naming_them(titan: Titan) -> None:
    run = Run("llama3", "spmd_types", tp=2)
    model = build(run)
    whole = shapes_from_module(model)
    titan.parallelize(run, model, titan.parallel_dims(run))
    local = {n: tuple(p.shape) for n, p in model.named_parameters()}
    # what the old reading gave: a local shard's shape as the global one
    assert any(local[n] != whole[n].shape for n in local)
    for reader in (table_from_module, shapes_from_module):
        with pytest.raises(LayoutError, match="spmd_types") as info:
            reader(model)
        message = info.value.message
        assert "layers.0.attention.wq.weight" in message or "layers.0.attention" in message
        assert "plan_from_torchtitan" in message and "full_dtensor" in message
        assert info.value.fqn is not None and info.value.fqn in local


def test_spmd_types_replicated_records_are_plain(titan: Titan) -> None:
    """A record with no V or P entry (every rank holds the whole tensor) reads as before."""
    run = Run("llama3", "spmd_types", tp=2)
    model = build(run)
    titan.parallelize(run, model, titan.parallel_dims(run))
    norm = model.get_submodule("norm")
    assert isinstance(norm, nn.Module)
    kept = {n: getattr(p, "_local_type", None) for n, p in norm.named_parameters()}
    assert kept and all(v is not None for v in kept.values())
    assert set(shapes_from_module(norm)) == set(kept)
    assert all(not layout.axes for _, layout in table_from_module(norm).items())


# ---------------------------------------------------------------------------------------
# activation checkpointing's wrapper: every reader names parameters as the state dict does


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.emb.weight


AXES = ("dp_shard", "tp")


def wrapped(how: str) -> Tiny:
    """A ``Tiny`` whose blocks torch's activation checkpointing wraps, one way or the other."""
    model = Tiny()
    if how == "apply":
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    else:
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block)
    raw = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert any("._checkpoint_wrapped_module." in n for n in raw)
    return model


@pytest.mark.parametrize("how", ["apply", "wrap"])
def test_checkpoint_wrapped_models_read_as_their_state_dict(how: str) -> None:
    model = wrapped(how)
    plain = Tiny()
    keys = list(model.state_dict(keep_vars=True))
    assert keys == list(plain.state_dict(keep_vars=True))  # torch's own naming
    assert list(shapes_from_module(model)) == keys
    assert shapes_from_module(model) == shapes_from_module(plain)
    assert table_from_module(model) == table_from_module(plain)
    assert tied_pairs_from_module(model) == (("emb.weight", "head.weight"),)
    plan = plan_from_parallelize(
        model,
        {"layers.*._checkpoint_wrapped_module.up": ColwiseParallel()},
        mesh_axes=AXES,
    )
    assert [fqn for fqn, _, _ in plan.named_placements()] == [
        f"layers.{i}.up.{leaf}" for i in range(2) for leaf in ("weight", "bias")
    ]


def test_checkpoint_wrapped_models_bind_and_distribute_by_state_dict_fqns(
    world_mesh: MeshFactory,
) -> None:
    model = wrapped("apply")
    mesh = world_mesh({"dp_shard": 2, "tp": 4})
    plan = plan_from_parallelize(
        model, {"layers.*._checkpoint_wrapped_module.up": ColwiseParallel()}, mesh_axes=AXES
    )
    table = build_table(plan, AXES, fqns=list(model.state_dict()))
    bindings = bind(table, model, {"dense": mesh})
    assert sorted(b.fqn for _, b in bindings.items()) == [
        f"layers.{i}.up.{leaf}" for i in range(2) for leaf in ("bias", "weight")
    ]
    distribute(model, table, {"dense": mesh})
    up = model.state_dict()["layers.1.up.weight"]
    assert isinstance(up, DTensor) and up.placements == (TorchShard(0),)
    assert table_from_module(model)["layers.1.up.weight"] == table["layers.1.up.weight"]
    with pytest.raises(BindError, match=r"layers\.0\.up\.wieght"):
        bind(
            table.with_entries({"layers.0.up.wieght": table["layers.0.up.weight"]}),
            model,
            {"dense": mesh},
        )
