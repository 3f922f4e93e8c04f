"""Checkpoints on real collectives: 4 gloo ranks save with DCP and load under another layout.

A model with an embedding tied to its head (17 rows: an uneven vocabulary), linears with
biases, a plain norm, a 3-row gate (one rank's saved shard is empty) and 3-D experts is
laid out on a dense ``(dp_shard=2, tp=2)`` mesh and an expert ``(edp_shard=2, ep=2)``
mesh, wrapped by torch's ``fully_shard`` (experts over ``edp_shard``, the rest over
``dp_shard``) and saved with ``torch.distributed.checkpoint``. A fresh model is laid out
otherwise (dense ``tp=4`` without FSDP, experts on an ``(ep=2, edp_shard=2)`` mesh, FSDP
on their dim 1) and loads the checkpoint with a ``DefaultLoadPlanner`` that records the
local plan it makes.

The test then holds, from one spawn: the chunks the checkpoint's metadata records for
every parameter (``dcp_chunks`` must give them), every rank's read items (``reshard_plan``
must give them, chunk by chunk and byte by byte), and each rank's check that the loaded
values equal the saved ones bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final, NamedTuple

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Shard as TorchShard

from layout_algebra import (
    ParamLayoutTable,
    Replicate,
    Shard,
    SourceLayout,
    compose_fsdp,
)
from layout_algebra.checkpoint import Chunk, dcp_chunks, reshard_plan
from layout_algebra.fsdp import compose_table
from layout_algebra.torch_bridge import distribute
from tests.models import TiedTP, param_values
from tests.torch_oracle import MeshFactory, on_gloo

WORLD_SIZE: Final = 4
SEED: Final = 0
VOCAB: Final = 17
S0, S1, R = Shard(0), Shard(1), Replicate()

SRC_SIZES: Final = {"dense": {"dp_shard": 2, "tp": 2}, "expert": {"edp_shard": 2, "ep": 2}}
DST_SIZES: Final = {"dense": {"tp": 4}, "expert": {"ep": 2, "edp_shard": 2}}


def make_model() -> TiedTP:
    """A tied embedding and head, TP linears with biases, a plain norm, 4 experts, and a
    3-row gate: over tp=2 and FSDP's dp_shard=2, one rank's shard of it is empty."""
    model = TiedTP(vocab=VOCAB, hidden=12, norm=True, experts=4)
    model.register_parameter("gate", nn.Parameter(torch.randn(3, 8)))
    return model


TIED: Final = [frozenset({"emb.weight", "head.weight"})]


def dense(*placements: Shard | Replicate) -> SourceLayout:
    return SourceLayout("dense", ["tp"], placements)


def save_table() -> ParamLayoutTable:
    """Vocabulary-parallel embedding and head, column- then row-wise linears, EP experts."""
    return ParamLayoutTable(
        {
            "emb.weight": dense(S0),
            "head.weight": dense(S0),
            "up.weight": dense(S0),
            "up.bias": dense(S0),
            "down.weight": dense(S1),
            "down.bias": dense(R),
            "norm": SourceLayout("dense", (), ()),
            "gate": dense(S0),
            "experts.w1": SourceLayout("expert", ["ep"], [S0]),
            "experts.w2": SourceLayout("expert", ["ep"], [S0]),
        },
        tied=TIED,
    )


def load_table() -> ParamLayoutTable:
    """The embedding split by columns, the linears the other way round, experts by rows."""
    return ParamLayoutTable(
        {
            "emb.weight": dense(S1),
            "head.weight": dense(S1),
            "up.weight": dense(S1),
            "up.bias": dense(R),
            "down.weight": dense(S0),
            "down.bias": dense(S0),
            "norm": SourceLayout("dense", (), ()),
            "gate": dense(R),
            "experts.w1": SourceLayout("expert", ["ep"], [S1]),
            "experts.w2": SourceLayout("expert", ["ep"], [S0]),
        },
        tied=TIED,
    )


def saved_layouts() -> ParamLayoutTable:
    """The layouts the saved parameters have: everything through FSDP on dim 0."""
    return compose_table(
        save_table(), fsdp={"dense": "dp_shard", "expert": "edp_shard"}, mesh_sizes=SRC_SIZES
    )


def loaded_layouts() -> ParamLayoutTable:
    """The layouts the loading parameters have: only the experts through FSDP, on dim 1."""
    table = load_table()
    experts = {
        fqn: compose_fsdp(
            layout, shard_axis="edp_shard", mesh_sizes=DST_SIZES["expert"], shard_dim=1
        )
        for fqn, layout in table.items()
        if layout.mesh == "expert"
    }
    return table.with_entries(experts)


# ---------------------------------------------------------------------------------------
# one rank


class RecordingPlanner(DefaultLoadPlanner):
    """torch's default load planner, keeping the local plan it makes."""

    recorded: LoadPlan | None = None

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        self.recorded = plan
        return plan


def read_items(planner: RecordingPlanner) -> list[list[object]]:
    """The recorded reads: fqn, the saved chunk's offsets and sizes, then the box."""
    assert planner.recorded is not None and planner.metadata is not None
    out: list[list[object]] = []
    for item in planner.recorded.items:
        fqn = item.storage_index.fqn
        md = planner.metadata.state_dict_metadata[fqn]
        assert isinstance(md, TensorStorageMetadata) and item.storage_index.index is not None
        saved = md.chunks[item.storage_index.index]
        assert list(saved.offsets) == list(item.storage_index.offset or ())
        out.append(
            [
                fqn,
                list(saved.offsets),
                list(saved.sizes),
                list(item.dest_offsets),
                list(item.storage_offsets),
                list(item.lengths),
            ]
        )
    return out


def check(failures: list[str], ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def scenario(rank: int, checkpoint: str) -> dict[str, object]:
    """One rank: save, load under the other layout; its failures and the reads it made."""
    failures: list[str] = []
    torch.manual_seed(SEED)
    model = make_model()
    originals = param_values(model)
    meshes = MeshFactory(WORLD_SIZE)
    mesh = meshes({"dp_shard": 2, "tp": 2})
    emesh = meshes({"edp_shard": 2, "ep": 2})
    distribute(model, save_table(), {"dense": mesh, "expert": emesh})
    fully_shard(model.experts, mesh=emesh["edp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    save(model.state_dict(), checkpoint_id=checkpoint)

    torch.manual_seed(SEED + 1)  # other values, so the load must bring the originals
    fresh = make_model()
    tp4 = meshes({"tp": 4})
    emesh2 = meshes({"ep": 2, "edp_shard": 2})
    distribute(fresh, load_table(), {"dense": tp4, "expert": emesh2})
    fully_shard(fresh.experts, mesh=emesh2["edp_shard"], shard_placement_fn=lambda _: TorchShard(1))
    planner = RecordingPlanner()
    load(fresh.state_dict(), checkpoint_id=checkpoint, planner=planner)

    check(failures, fresh.emb.weight is fresh.head.weight, "fresh emb and head are not tied")
    for fqn, param in fresh.named_parameters(remove_duplicate=False):
        full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
        check(
            failures,
            torch.equal(full, originals[fqn]),
            f"{fqn}: rank {rank} loaded values that differ from the saved ones",
        )
    return {"failures": failures, "reads": read_items(planner)}


# ---------------------------------------------------------------------------------------
# the test


class Shape(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


def shapes() -> dict[str, Shape]:
    with torch.device("meta"):
        model = make_model()
    return {
        fqn: Shape(tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for fqn, p in model.named_parameters(remove_duplicate=False)
    }


@pytest.mark.distributed
def test_dcp_records_dcp_chunks_and_loads_with_reshard_plan_reads(tmp_path: Path) -> None:
    results = on_gloo(scenario, str(tmp_path / "checkpoint"), world_size=WORLD_SIZE)
    assert [r["failures"] for r in results] == [[]] * WORLD_SIZE

    # every parameter's chunks in the checkpoint's metadata
    metadata = FileSystemReader(str(tmp_path / "checkpoint")).read_metadata()
    saved = saved_layouts()
    params = shapes()
    assert set(metadata.state_dict_metadata) == set(saved)
    for fqn, layout in saved.items():
        md = metadata.state_dict_metadata[fqn]
        assert isinstance(md, TensorStorageMetadata)
        recorded = sorted(Chunk(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks)
        assert list(dcp_chunks(layout, params[fqn].shape, SRC_SIZES[layout.mesh])) == recorded, fqn
    assert Chunk((3, 0), (0, 8)) in dcp_chunks(saved["gate"], (3, 8), SRC_SIZES["dense"])

    # every rank's reads, and their bytes
    plan = reshard_plan(saved, loaded_layouts(), params, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)
    for rank, result in enumerate(results):
        theirs = sorted(as_read(item) for item in result["reads"])
        mine: list[ReadKey] = sorted(
            (
                r.fqn,
                r.chunk.offsets,
                r.chunk.sizes,
                r.dest_offsets,
                r.storage_offsets,
                r.lengths,
            )
            for r in plan.reads(rank)
        )
        assert mine == theirs, rank
        nbytes = sum(
            math.prod(lengths) * getattr(torch, params[fqn].dtype).itemsize
            for fqn, *_, lengths in theirs
        )
        assert plan.bytes_read[rank] == nbytes


ReadKey = tuple[
    str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]
]


def as_read(item: list[object]) -> ReadKey:
    """A recorded read, from its JSON form."""
    fqn, *boxes = item
    assert isinstance(fqn, str) and len(boxes) == 5
    chunk_offsets, chunk_sizes, dest, storage, lengths = (
        tuple(int(v) for v in box) for box in boxes if isinstance(box, list)
    )
    return fqn, chunk_offsets, chunk_sizes, dest, storage, lengths
