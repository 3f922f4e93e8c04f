"""``lint(..., stages=...)`` against a real pipeline step on 4 gloo ranks (``pp=2 x dp_shard=2``).

A small model named as torchtitan names its parts (``tok_embeddings``, ``layers`` keyed by
number, ``norm``, ``lm_head``) is split by torchtitan's own ``_split_module`` into the
stages ``Stages.balanced`` gives; each rank builds its pipeline coordinate's stage, wraps
each layer and the stage's root in ``fully_shard`` over ``dp_shard``, and runs one step of
torch's ``ScheduleGPipe`` and of its ``Schedule1F1B`` (2 microbatches) with AdamW. On
every rank: the parameter FQNs its stage module holds, the bytes its parameters keep
(``to_local()``), the storage FSDP2 allocates for them and their gradients (its padded
shards) and the bytes of the optimizer's state equal what the staged lint gives
that rank.
"""

from __future__ import annotations

from typing import Any, Final

import pytest

pytest.importorskip("torchtitan")

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from layout_algebra import Mesh, ParamLayoutTable, SourceLayout, Stages, Training, lint
from layout_algebra.stages import assign_stages
from layout_algebra.torch_bridge import shapes_from_module
from tests.test_training_gloo import _storage_bytes
from tests.torch_oracle import MeshFactory, on_gloo
from tests.torchtitan_runs import function

WORLD_SIZE: Final = 4
VOCAB: Final = 13
DIM: Final = 8
LAYERS: Final = 4
SIZES: Final = {"pp": 2, "dp_shard": 2}
STAGES: Final = Stages.balanced("pp", layers=LAYERS, pp=2)
SCHEDULES: Final = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, 12)
        self.w2 = nn.Linear(12, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.w2(torch.relu(self.w1(x)))
        return out


class Net(nn.Module):
    """Each part optional, as torchtitan's models are: a stage keeps some of them."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm: nn.Module | None = nn.LayerNorm(DIM)
        self.lm_head: nn.Module | None = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _step(rank: int, meshes: MeshFactory, schedule: str) -> dict[str, Any]:
    torch.manual_seed(0)
    whole = Net()
    mesh = meshes(SIZES)
    pp = mesh["pp"].get_local_rank()
    names = [list(s) for s in STAGES.stages][pp]
    chunk = function("torchtitan.distributed.pipeline_parallel", "_split_module")(whole, names)
    assert isinstance(chunk, Net)
    fqns = sorted(name for name, _ in chunk.named_parameters())
    for layer in chunk.layers.values():
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(chunk, mesh=mesh["dp_shard"])
    stage = PipelineStage(chunk, pp, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    run = SCHEDULES[schedule](stage, n_microbatches=2, loss_fn=_loss)
    optimizer = torch.optim.AdamW(chunk.parameters(), lr=0.1)
    tokens = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(1))
    if pp == 0:
        run.step(tokens)
    else:
        run.step(target=tokens)
    optimizer.step()
    states = sum(_nbytes(v) for state in optimizer.state.values() for v in state.values())
    return {
        "fqns": fqns,
        "params": sum(_nbytes(p) for p in chunk.parameters()),
        "allocated": _storage_bytes(chunk.parameters()),
        "grads": _storage_bytes(p.grad for p in chunk.parameters() if p.grad is not None),
        "optimizer": states,
    }


def scenario(rank: int) -> dict[str, dict[str, Any]]:
    meshes = MeshFactory(WORLD_SIZE)
    return {name: _step(rank, meshes, name) for name in SCHEDULES}


@pytest.mark.distributed
def test_a_pipeline_step_keeps_what_the_staged_lint_says_on_every_rank() -> None:
    by_rank = on_gloo(scenario, world_size=WORLD_SIZE)
    with torch.device("meta"):
        model = Net()
    shapes = shapes_from_module(model)
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in shapes})
    for name in SCHEDULES:
        report = lint(
            table,
            shapes,
            mesh_sizes=Mesh(SIZES),
            fsdp={"dense": "dp_shard"},
            training=Training(units=["layers.*"], optimizer="adamw"),
            stages=Stages.balanced("pp", layers=LAYERS, pp=2, schedule=name),
        )
        assert report.ok, report.problems
        assigned = assign_stages(STAGES, table)
        for rank, results in enumerate(by_rank):
            got = results[name]
            pp = Mesh(SIZES).coordinate(rank)[0]
            assert got["fqns"] == sorted(
                f for f, s in zip(table, assigned.of, strict=True) if s == pp
            )
            assert got["params"] == report.memory.bytes_per_rank[rank], (name, rank)
            assert got["optimizer"] == report.memory.by_kind["optimizer"][rank], (name, rank)
            assert got["allocated"] == report.memory.by_kind["params"][rank], (name, rank)
            assert got["grads"] == report.memory.by_kind["grads"][rank], (name, rank)
            assert got["optimizer"] > 0  # the step reached every parameter of the stage
