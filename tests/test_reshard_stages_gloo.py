"""A PP=4 checkpoint loaded under PP=2 on 4 gloo ranks: ``reshard_plan(stages=...)`` makes
torch's reads, rank by rank.

A model named as torchtitan names its parts (``tok_embeddings``, ``layers`` keyed by
number, ``norm``, ``lm_head``; each block with a 1-row ``score``, which FSDP over 2 ranks
leaves empty on one) is split into 4 stages as torchtitan splits a model it pipelines
(each stage a copy of the model with the other stages' modules removed, FQNs kept). Each
rank saves its own stage's state dict with DCP, as torchtitan saves its model parts: one
rank writes each tensor, whole. Then each rank builds what it runs under ``pp=2 x
dp_shard=2``, wraps every block and the part's root in ``fully_shard`` over ``dp_shard``
and loads with a planner that records torch's local plan: once with 2 stages (1F1B), once
with 4 (interleaved: pipeline rank 0 runs stages 0 and 2, loading both parts' state
dicts in one ``dcp.load``). Each rank's read items, and the values loaded, are checked
against the plan and the saved model; ``layout-algebra reshard CKPT_DIR --pp-layers N``
on the directory prints that plan.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from layout_algebra import (
    Chunk,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    ShardingPlan,
    SourceLayout,
    Stages,
    compose_table,
    dcp_chunks,
    reshard_plan,
)
from layout_algebra.checkpoint import ReshardPlan
from layout_algebra.serialization import plan_to_json
from layout_algebra.stages import assign_stages
from layout_algebra.torch_bridge import shapes_from_module
from tests.test_cli import run, write
from tests.test_dcp import ReadKey, RecordingPlanner, as_read, check, read_items
from tests.torch_oracle import MeshFactory, on_gloo

WORLD_SIZE: Final = 4
SEED: Final = 0
VOCAB: Final = 13
DIM: Final = 8
LAYERS: Final = 6

SAVED_ON: Final = {"dense": {"pp": 4}}
LOADED_ON: Final = {"dense": {"pp": 2, "dp_shard": 2}}
SAVED_STAGES: Final = Stages.balanced("pp", layers=LAYERS, pp=4)
"""[tok_embeddings, layers.0] [layers.1, layers.2] [layers.3, layers.4] [layers.5, norm,
lm_head]: one stage per saving rank."""
LOADS: Final = {
    "1f1b": Stages.balanced("pp", layers=LAYERS, pp=2),
    "interleaved": Stages.balanced("pp", layers=LAYERS, pp=2, schedule="interleaved-1f1b"),
}
"""The loading run's stages: 2 (the first blocks with the embedding, the last with the
head), or the saving run's 4 on 2 pipeline ranks."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, 12)
        self.w2 = nn.Linear(12, DIM, bias=False)
        self.score = nn.Linear(DIM, 1, bias=False)  # 1 row: rank 1 of dp_shard holds none


class Net(nn.Module):
    """Each part optional, as torchtitan's models are: a stage keeps some of them."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm: nn.Module | None = nn.LayerNorm(DIM)
        self.lm_head: nn.Module | None = nn.Linear(DIM, VOCAB, bias=False)


def stage_part(stages: Stages, stage: int, seed: int) -> Net:
    """The model (its values drawn from ``seed``) with only ``stage``'s modules left, as
    torchtitan's ``_split_module`` leaves them: the others deleted or ``None``."""
    torch.manual_seed(seed)
    part = Net()
    keep = set(stages.stages[stage])
    for name in list(part.layers):
        if f"layers.{name}" not in keep:
            del part.layers[name]
    for name in ("tok_embeddings", "norm", "lm_head"):
        if name not in keep:
            setattr(part, name, None)
    return part


def originals() -> dict[str, torch.Tensor]:
    torch.manual_seed(SEED)
    return {fqn: p.detach().clone() for fqn, p in Net().named_parameters()}


# ---------------------------------------------------------------------------------------
# one rank


def load_staged(rank: int, meshes: MeshFactory, stages: Stages, checkpoint: str) -> dict[str, Any]:
    """Build the parts this rank's pipeline coordinate runs, FSDP over ``dp_shard``, and
    load the checkpoint into them (one ``dcp.load`` of their merged state dicts, as
    torchtitan's model wrapper does): the keys, the reads and the failures."""
    failures: list[str] = []
    mesh = meshes(LOADED_ON["dense"])
    pp = mesh["pp"].get_local_rank()
    mine = [s for s in range(len(stages.stages)) if stages.rank_of(s, mesh["pp"].size()) == pp]
    parts = [stage_part(stages, s, SEED + 1) for s in mine]  # other values: the load brings them
    for part in parts:
        for block in part.layers.values():
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(part, mesh=mesh["dp_shard"])
    state = {k: v for part in parts for k, v in part.state_dict().items()}
    planner = RecordingPlanner()
    load(state, checkpoint_id=checkpoint, planner=planner)
    saved = originals()
    for part in parts:
        for fqn, param in part.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            check(
                failures,
                torch.equal(full, saved[fqn]),
                f"{fqn}: rank {rank} loaded values that differ from the saved ones",
            )
    return {"failures": failures, "keys": sorted(state), "reads": read_items(planner)}


def scenario(rank: int, checkpoint: str) -> dict[str, Any]:
    """One rank: save its stage of the PP=4 run, then load under each of ``LOADS``."""
    part = stage_part(SAVED_STAGES, rank, SEED)  # pipeline rank r of pp=4 runs stage r
    save(part.state_dict(), checkpoint_id=checkpoint)
    meshes = MeshFactory(WORLD_SIZE)
    return {name: load_staged(rank, meshes, stages, checkpoint) for name, stages in LOADS.items()}


# ---------------------------------------------------------------------------------------
# the test


def plain_table() -> ParamLayoutTable:
    """Every parameter a plain tensor: no TP, and the saving run had no FSDP (dp=1)."""
    return ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in originals()})


def mine(plan: ReshardPlan, rank: int) -> list[ReadKey]:
    return sorted(
        (r.fqn, r.chunk.offsets, r.chunk.sizes, r.dest_offsets, r.storage_offsets, r.lengths)
        for r in plan.reads(rank)
    )


@pytest.mark.distributed
def test_a_pp4_checkpoint_loads_under_pp2_with_reshard_plans_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = str(tmp_path / "checkpoint")
    results = on_gloo(scenario, checkpoint, world_size=WORLD_SIZE)
    with torch.device("meta"):
        shapes = shapes_from_module(Net())
    table = plain_table()

    # each tensor written once, whole, by the rank of its stage
    metadata = FileSystemReader(checkpoint).read_metadata()
    assert set(metadata.state_dict_metadata) == set(table)
    for fqn, layout in table.items():
        md = metadata.state_dict_metadata[fqn]
        assert isinstance(md, TensorStorageMetadata)
        recorded = sorted(Chunk(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks)
        assert list(dcp_chunks(layout, shapes[fqn].shape, SAVED_ON["dense"])) == recorded, fqn

    loaded = compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=LOADED_ON)
    no_tp = ShardingPlan({"": ModulePlan({})}, mesh_axes=list(LOADED_ON["dense"]))
    plan_file = write(tmp_path / "plan.json", plan_to_json(no_tp))
    for name, stages in LOADS.items():
        got = [result[name] for result in results]
        assert [g["failures"] for g in got] == [[]] * WORLD_SIZE, name
        plan = reshard_plan(
            table, loaded, shapes, src_sizes=SAVED_ON, dst_sizes=LOADED_ON, stages=stages
        )
        # the checkpoint directory read for the layouts, shapes and sizes (spelled dense[pp=R])
        from_directory = reshard_plan(
            checkpoint,
            loaded,
            src_sizes=Mesh(SAVED_ON["dense"]),
            dst_sizes=LOADED_ON,
            stages=stages,
        )
        # the same plan from the source tables, FSDP composed by reshard_plan (the saving
        # run's FSDP axis of size 1 shards nothing)
        composed_here = reshard_plan(
            table,
            table,
            shapes,
            src_sizes={"dense": {**SAVED_ON["dense"], "dp_shard": 1}},
            dst_sizes=LOADED_ON,
            fsdp={"dense": "dp_shard"},
            stages=stages,
        )
        assigned = assign_stages(stages, table)
        chunks: dict[str, int] = dict.fromkeys(table, 0)
        nbytes: dict[str, int] = dict.fromkeys(table, 0)
        for rank, result in enumerate(got):
            pp = Mesh(LOADED_ON["dense"]).coordinate(rank)[0]
            held = sorted(
                f
                for f, s in zip(table, assigned.of, strict=True)
                if s is not None and stages.rank_of(s, 2) == pp
            )
            assert result["keys"] == held, (name, rank)
            theirs = sorted(as_read(item) for item in result["reads"])
            assert mine(plan, rank) == theirs, (name, rank)
            assert mine(composed_here, rank) == theirs, (name, rank)
            assert mine(from_directory, rank) == theirs, (name, rank)
            read = 0
            for fqn, *_, lengths in theirs:
                n = math.prod(lengths) * getattr(torch, shapes[fqn].dtype).itemsize
                chunks[fqn], nbytes[fqn], read = chunks[fqn] + 1, nbytes[fqn] + n, read + n
            assert plan.bytes_read[rank] == read, (name, rank)
        assert dict(plan.by_param) == nbytes, name
        assert {fqn: plan.chunks_read(fqn) for fqn in table} == chunks, name
        # the 1-row score: rank 0 of each dp_shard pair reads it, rank 1 holds none
        assert chunks["layers.0.score.weight"] == 1

        # the command line, on the directory and the plan of a run with no TP (its table:
        # every saved tensor, in the checkpoint's order, FSDP over the mesh's dp_shard)
        capsys.readouterr()
        argv = ["reshard", checkpoint, plan_file, "--mesh", "pp=4", "--to-mesh", "pp=2,dp_shard=2"]
        layers = {"1f1b": "4", "interleaved": "2"}[name]
        code, out, err = run([*argv, "--pp-layers", layers], capsys)
        assert (code, err) == (0, ""), name
        assert out == (
            "saved on dense (pp=4), loaded on dense (pp=2, dp_shard=2)\n"
            f"stages: --pp-layers {layers} deals them so: {stages}\n"
            f"{from_directory.report()}\n"
        )
