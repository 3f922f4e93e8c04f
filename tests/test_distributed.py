"""The bridge on real collectives: 4 gloo ranks on CPU, spawned once for the whole story.

A small model with a tied embedding and head is laid out by ``build_table`` on a
``(dp_shard=2, tp=2)`` mesh, ``distribute``d, and wrapped by torch's own ``fully_shard``
over ``dp_shard``. Every rank checks that its local shard is the block of the original
tensor it should hold (tensor parallel first, then FSDP's dim-0 chunk of that) and that
``full_tensor()`` gives the original back bit for bit. The model is then saved with
``torch.distributed.checkpoint`` and loaded into a fresh model laid out differently
(``tp=4``, no FSDP), whose full tensors must equal the originals bit for bit.

Each rank returns its failures; the test asserts that every rank's list is empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from layout_algebra import ModulePlan, Placement, Shard, ShardingPlan, build_table
from layout_algebra.torch_bridge import distribute, table_from_module, to_torch
from tests.models import ToyModel, param_values
from tests.torch_oracle import MeshFactory, fsdp_block, on_gloo

WORLD_SIZE: Final = 4
SEED: Final = 0


def make_model() -> ToyModel:
    """A tied embedding and head of 16 rows, one block of attention-like linears and a norm."""
    return ToyModel(vocab=16, layers=1, experts=0)


def plan(*, emb: Placement, wq: Placement, wo: Placement) -> ShardingPlan:
    return ShardingPlan(
        {
            "emb": ModulePlan({"weight": {"tp": emb}}),
            "layers.0": ModulePlan(
                {"attn.wq.weight": {"tp": wq}, "attn.wo.weight": {"tp": wo}, "norm": {}}
            ),
        },
        mesh_axes=("dp_shard", "tp"),
        tied_pairs=[("emb.weight", "head.weight")],
    )


def check(failures: list[str], ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def scenario(rank: int, checkpoint: str) -> list[str]:
    failures: list[str] = []
    torch.manual_seed(SEED)
    model = make_model()
    originals = param_values(model)

    meshes = MeshFactory(WORLD_SIZE)
    mesh = meshes({"dp_shard": 2, "tp": 2})
    table = build_table(plan(emb=Shard(0), wq=Shard(0), wo=Shard(1)), mesh.mesh_dim_names or ())
    distribute(model, table, {"dense": mesh})
    fully_shard(model, mesh=mesh["dp_shard"])

    coordinate = mesh.get_coordinate()
    assert coordinate is not None
    sizes = dict(zip(("dp_shard", "tp"), mesh.shape, strict=True))
    at = dict(zip(("dp_shard", "tp"), coordinate, strict=True))
    check(failures, model.emb.weight is model.head.weight, "emb and head are no longer tied")
    for fqn, param in model.named_parameters(remove_duplicate=False):
        if not isinstance(param, DTensor):
            failures.append(f"{fqn}: not a DTensor after fully_shard")
            continue
        # its tp block as distribute_tensor cuts it, then FSDP2's dim-0 chunk of that
        want = fsdp_block(originals[fqn], table[fqn], sizes, at, shard="dp_shard")
        local = param.to_local()
        check(
            failures,
            local.shape == want.shape and torch.equal(local, want),
            f"{fqn}: rank {rank} holds {tuple(local.shape)}, not its block of the original",
        )
        check(
            failures,
            torch.equal(param.full_tensor(), originals[fqn]),
            f"{fqn}: full_tensor() differs from the original",
        )
    check(failures, table_from_module(model) == table, "table_from_module after fully_shard")

    save(model.state_dict(), checkpoint_id=checkpoint)

    torch.manual_seed(SEED + 1)  # other values, so the load must bring the originals
    fresh = make_model()
    tp4 = meshes({"tp": 4})
    other = build_table(plan(emb=Shard(1), wq=Shard(1), wo=Shard(0)), ("tp",))
    distribute(fresh, other, {"dense": tp4})
    state = fresh.state_dict()
    load(state, checkpoint_id=checkpoint)
    check(failures, fresh.emb.weight is fresh.head.weight, "fresh emb and head not tied")
    for fqn, param in fresh.named_parameters(remove_duplicate=False):
        if not isinstance(param, DTensor):
            failures.append(f"fresh {fqn}: not a DTensor")
            continue
        want_placements = tuple(to_torch(p) for p in other[fqn].placements)
        check(
            failures,
            param.device_mesh == tp4 and param.placements == want_placements,
            f"fresh {fqn}: {param.placements} on {param.device_mesh}",
        )
        check(
            failures,
            torch.equal(param.full_tensor(), originals[fqn]),
            f"fresh {fqn}: loaded full tensor differs from the saved original",
        )
    return failures


@pytest.mark.distributed
def test_distribute_fully_shard_and_checkpoint_on_gloo(tmp_path: Path) -> None:
    failures = on_gloo(scenario, str(tmp_path / "checkpoint"), world_size=WORLD_SIZE)
    assert failures == [[]] * WORLD_SIZE
