"""The test kit's oracles against torch moving real data, on every rank of a fake world.

``distribute_tensor(..., src_data_rank=None)`` and ``fully_shard`` cut a rank's block out
of its own full tensor without communicating, so on the fake process group every rank
holds real data: the blocks the oracles name must be the ones torch keeps there, and the
coordinates they number ranks by must be the mesh's own. ``on_gloo`` must report a rank
that raised.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from layout_algebra import Replicate, Shard, SourceLayout, compose_fsdp
from layout_algebra.torch_bridge import to_torch
from tests.models import OneParam
from tests.torch_oracle import (
    MeshFactory,
    coordinates,
    dtensor_block,
    dtensor_indices,
    dtensor_shape_and_offset,
    fsdp_block,
    fsdp_managed,
    fully_sharded,
    layout_of,
    on_fake_ranks,
    on_gloo,
    rank_block,
    rank_coordinates,
)

S0, S1, R = Shard(0), Shard(1), Replicate()

CASES = {
    "tp-rows-uneven": ({"dp_shard": 2, "tp": 4}, SourceLayout("dense", ["tp"], [S0]), (10, 3)),
    "tp-cols": ({"dp_shard": 4, "tp": 2}, SourceLayout("dense", ["tp"], [S1]), (7, 6)),
    "ep-tp": (
        {"dp_shard": 2, "ep": 2, "tp": 2},
        SourceLayout("expert", ["ep", "tp"], [S0, S1]),
        (4, 5, 3),
    ),
    "plain": ({"dp_shard": 8}, SourceLayout("dense", [], []), (5, 2)),
}


def blocks_on_rank(rank: int) -> dict[str, list[str]]:
    """Per case, what differs on this rank between torch and the oracles (nothing, we hope)."""
    meshes = MeshFactory(8)
    out: dict[str, list[str]] = {}
    for name, (sizes, source, shape) in CASES.items():
        problems: list[str] = []
        mesh = meshes(sizes)
        coordinate = mesh.get_coordinate()
        assert coordinate is not None
        at = dict(zip(sizes, coordinate, strict=True))
        if at != list(rank_coordinates(sizes))[rank]:
            problems.append(f"the mesh puts rank {rank} at {at}")
        torch.manual_seed(0)
        module = OneParam(shape)
        full = module.w.detach().clone()
        if source.axes:
            sub = mesh[tuple(a.name for a in source.axes)]
            placements = [to_torch(p) for p in source.placements]
            dt = distribute_tensor(full, sub, placements, src_data_rank=None)
            if not torch.equal(dt.to_local(), dtensor_block(full, source, sizes, at)):
                problems.append("distribute_tensor keeps another block than dtensor_block")
            if not torch.equal(dt.to_local(), rank_block(full, dt)):
                problems.append("distribute_tensor keeps another block than rank_block")
            module.w = nn.Parameter(dt)
        fully_shard(module, mesh=mesh["dp_shard"])
        w = module.w
        assert isinstance(w, DTensor)
        if not torch.equal(w.to_local(), fsdp_block(full, source, sizes, at, shard="dp_shard")):
            problems.append("fully_shard keeps another block than fsdp_block")
        if fsdp_managed(module) != [w]:
            problems.append("fsdp_managed is not the sharded parameter")
        # the meta-device oracle gives the placements of the real thing, as composed
        composed = layout_of(w, source.mesh)
        if composed != layout_of(fully_sharded(mesh, source, shape, shard="dp_shard"), source.mesh):
            problems.append("fully_sharded on the meta device gives other placements")
        if composed != compose_fsdp(source, shard_axis="dp_shard", mesh_sizes=sizes):
            problems.append(f"compose_fsdp differs from {composed}")
        out[name] = problems
    return out


def test_the_blocks_are_the_ones_torch_keeps_on_every_rank() -> None:
    by_rank = on_fake_ranks(blocks_on_rank)
    assert by_rank == [{name: [] for name in CASES}] * 8


def test_indices_shape_and_offset_agree_where_the_block_is_contiguous() -> None:
    layout = SourceLayout("dense", ["tp", "sp"], [S0, S1])
    sizes = {"tp": 4, "sp": 3}
    for at in coordinates(["tp", "sp"], sizes):
        indices = dtensor_indices((10, 4), layout, sizes, at)
        shape, offset = dtensor_shape_and_offset((10, 4), layout, sizes, at)
        assert shape == tuple(len(i) for i in indices)
        assert all(
            list(i) == list(range(o, o + len(i))) for i, o in zip(indices, offset, strict=True)
        )


def test_meshes_are_built_once(world_mesh: MeshFactory) -> None:
    assert world_mesh({"dp_shard": 2, "tp": 4}) is world_mesh({"dp_shard": 2, "tp": 4})
    assert world_mesh({"tp": 2, "dp_shard": 4}).mesh_dim_names == ("tp", "dp_shard")
    assert world_mesh.unnamed(8).mesh_dim_names is None
    with pytest.raises(ValueError, match=r"shape \(2, 2\) holds 4 ranks, but the world has 8"):
        world_mesh({"dp": 2, "tp": 2})


def summed_rank(rank: int, fail_on: int) -> int:
    """All ranks' ranks summed by a real all-reduce; then rank ``fail_on`` raises."""
    total = torch.tensor([rank])
    dist.all_reduce(total)
    if rank == fail_on:
        msg = f"rank {rank} was told to fail (the sum was {int(total)})"
        raise ValueError(msg)
    return int(total)


@pytest.mark.distributed
def test_on_gloo_reports_the_rank_that_raised() -> None:
    with pytest.raises(
        AssertionError,
        match=r"(?s)^rank 1 raised:.*ValueError: rank 1 was told to fail \(the sum was 1\)",
    ):
        on_gloo(summed_rank, 1, world_size=2)
