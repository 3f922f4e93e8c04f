"""``Stages`` against torch's own pipelining, on the fake 8-rank world.

torchtitan's llama3 debug model (its six layers, on the meta device) is split as torchtitan
splits it for pipeline parallelism: its own ``module_fqns_per_model_part`` for 2 and 4
stages, its own ``_split_module`` per stage, each chunk made a ``torch.distributed.
pipelining.PipelineStage`` on the ``pp`` group. The parameters each stage's module holds
are exactly those ``Stages`` assigns to it, and a rank's parameter bytes (each chunk under
``fully_shard`` over ``dp_shard``) are those ``lint(..., stages=...)`` gives the rank of that
pipeline coordinate.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor

from layout_algebra import Mesh, ParamLayoutTable, SourceLayout, Stages, lint
from layout_algebra.stages import assign_stages
from layout_algebra.torch_bridge import shapes_from_module
from tests.torch_oracle import MeshFactory
from tests.torchtitan_runs import function, function_of, get, module

pytestmark = [
    pytest.mark.usefixtures("fake_world"),
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

PIPELINE = "torchtitan.distributed.pipeline_parallel"


def llama3() -> tuple[nn.Module, int]:
    """torchtitan's llama3 debug model on the meta device, and its number of layers."""
    flavors = get(module("torchtitan.models.llama3"), "llama3_configs")
    assert isinstance(flavors, dict)
    cfg = flavors["debugmodel"](attn_backend="flex")
    layers = get(cfg, "layers")
    assert isinstance(layers, list)
    with torch.device("meta"):
        built = function_of(cfg, "build")()
    assert isinstance(built, nn.Module)
    return built, len(layers)


@pytest.mark.parametrize("pp", [2, 4])
def test_each_pipeline_stage_holds_what_stages_assigns(pp: int, world_mesh: MeshFactory) -> None:
    model, layers = llama3()
    parts = function(PIPELINE, "_generate_llm_fqn_per_model_part")(pp, layers, 1, 1)
    assert isinstance(parts, list)
    stages = Stages("pp", parts)
    assert stages == Stages.balanced("pp", layers=layers, pp=pp)  # the split it makes itself
    fqns = [name for name, _ in model.named_parameters()]
    assigned = assign_stages(stages, fqns)
    assert not assigned.unplaced and not assigned.doubled and not assigned.unused
    mesh = world_mesh({"pp": pp, "dp_shard": 8 // pp})
    split = function(PIPELINE, "_split_module")
    held: list[set[str]] = []
    for s, names in enumerate(parts):
        chunk = split(model, names)
        assert isinstance(chunk, nn.Module)
        stage = PipelineStage(chunk, s, pp, torch.device("meta"), group=mesh.get_group("pp"))
        mine = {fqn for fqn, at in zip(fqns, assigned.of, strict=True) if at == s}
        assert {name for name, _ in stage.submod.named_parameters()} == mine
        held.append(mine)
    assert set().union(*held) == set(fqns)

    # what a rank keeps: each stage's chunk under fully_shard over dp_shard (this process
    # is dp_shard coordinate 0), against lint's rank at (pp=s, dp_shard=0)
    shapes = shapes_from_module(model)
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in fqns})
    world = Mesh({"pp": pp, "dp_shard": 8 // pp})
    report = lint(table, shapes, mesh_sizes=world, fsdp={"dense": "dp_shard"}, stages=stages)
    assert report.ok, report.problems
    for s, names in enumerate(parts):
        chunk = split(model, names)
        assert isinstance(chunk, nn.Module)
        fully_shard(chunk, mesh=mesh["dp_shard"])
        local = 0
        for p in chunk.parameters():
            assert isinstance(p, DTensor)
            local += p.to_local().numel() * p.element_size()
        rank = world.rank((s, 0))
        assert report.memory.bytes_per_rank[rank] == local
        assert report.memory.by_stage[s][rank] == local
