"""Checkpoints written by real ranks: the saves and loads ``test_table_from_dcp`` reads.

One spawn of ``WORLD_SIZE`` gloo ranks writes every checkpoint of ``SAVES`` with
``torch.distributed.checkpoint.save`` (a model laid out by ``distribute``, then wrapped by
``fully_shard`` where the case says, saved with a ``"step"`` counter beside), and loads
some of them under another layout (``LOADS``) with a default load planner that records
its reads. Each rank reports the reads it made and whether the values it loaded are the
saved ones, bit for bit.

The cases are module-level values, so the test and the ranks read the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final, NamedTuple

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from layout_algebra import (
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    compose_table,
)
from layout_algebra.torch_bridge import distribute
from tests.test_dcp import RecordingPlanner, read_items
from tests.torch_oracle import MeshFactory

__all__ = ["LOADS", "SAVES", "WORLD_SIZE", "Case", "Load", "composed", "run"]

WORLD_SIZE: Final = 6
S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()
PLAIN: Final = SourceLayout("dense", (), ())


class Case(NamedTuple):
    """A model's parameters, their source layouts, the meshes by role and FSDP's axes."""

    shapes: Mapping[str, tuple[int, ...]]
    table: ParamLayoutTable
    meshes: Mapping[str, Mesh]
    fsdp: tuple[str, ...] = ()
    """FSDP's axes of the dense mesh: ``(shard,)``, or ``(replicate, shard)`` for HSDP."""


def _dense(axis: str, *placements: Shard | Replicate) -> SourceLayout:
    return SourceLayout("dense", [axis], placements)


SAVES: Final[dict[str, Case]] = {
    # tensor parallel only: rows uneven over 6, a row-wise weight, a replicated bias, a
    # plain norm
    "tp": Case(
        {"up": (10, 4), "down": (4, 12), "bias": (10,), "norm": (4,)},
        ParamLayoutTable(
            {
                "up": _dense("tp", S0),
                "down": _dense("tp", S1),
                "bias": _dense("tp", R),
                "norm": PLAIN,
            }
        ),
        {"dense": Mesh({"tp": 6})},
    ),
    # FSDP2 over tensor parallel: _StridedShard on the column-wise weights (12 rows even,
    # 10 rows uneven), FSDP's plain S(0) elsewhere (4 rows over 3 leave one shard empty)
    "fsdp_tp": Case(
        {"up": (12, 4), "gate": (10, 4), "down": (4, 6), "bias": (12,), "norm": (6,)},
        ParamLayoutTable(
            {
                "up": _dense("tp", S0),
                "gate": _dense("tp", S0),
                "down": _dense("tp", S1),
                "bias": _dense("tp", R),
                "norm": PLAIN,
            }
        ),
        {"dense": Mesh({"dp_shard": 3, "tp": 2})},
        ("dp_shard",),
    ),
    # an expert mesh (ep x tp) beside a dense tp mesh
    "experts": Case(
        {"emb": (12, 4), "w1": (3, 6, 8), "w2": (3, 8, 6)},
        ParamLayoutTable(
            {
                "emb": _dense("tp", S0),
                "w1": SourceLayout("expert", ["ep", "tp"], [S0, S1]),
                "w2": SourceLayout("expert", ["ep", "tp"], [S0, S2]),
            }
        ),
        {"dense": Mesh({"tp": 6}), "expert": Mesh({"ep": 3, "tp": 2})},
    ),
    # HSDP of plain parameters: replicated over dp_replicate, sharded over dp_shard
    "hsdp": Case(
        {"w": (6, 4), "norm": (5,)},
        ParamLayoutTable({"w": PLAIN, "norm": PLAIN}),
        {"dense": Mesh({"dp_replicate": 2, "dp_shard": 3})},
        ("dp_replicate", "dp_shard"),
    ),
    # the hazard: 7 rows over tp=2 (4 and 3), then FSDP over 3 (2, 2, 0 and 1, 1, 1);
    # DTensor's reading of the _StridedShard layout, which torch writes as the metadata,
    # gives row 6 to rank (2, 0), where FSDP2 keeps it on rank (2, 1)
    "hazard": Case(
        {"up": (7, 4), "down": (4, 6)},
        ParamLayoutTable({"up": _dense("tp", S0), "down": _dense("tp", S1)}),
        {"dense": Mesh({"dp_shard": 3, "tp": 2})},
        ("dp_shard",),
    ),
}


class Load(NamedTuple):
    """A saved checkpoint loaded into the model of ``into`` (that case's layouts)."""

    saved: str
    into: Case


LOADS: Final[dict[str, Load]] = {
    # FSDP + TP loaded as tensor parallel only, the other way round
    "fsdp_tp_as_tp": Load(
        "fsdp_tp",
        Case(
            SAVES["fsdp_tp"].shapes,
            ParamLayoutTable(
                {
                    "up": _dense("tp", S1),
                    "gate": _dense("tp", R),
                    "down": _dense("tp", S0),
                    "bias": _dense("tp", S0),
                    "norm": _dense("tp", S0),
                }
            ),
            {"dense": Mesh({"tp": 6})},
        ),
    ),
    # tensor parallel loaded under HSDP of plain parameters
    "tp_as_hsdp": Load(
        "tp",
        Case(
            SAVES["tp"].shapes,
            ParamLayoutTable({fqn: PLAIN for fqn in SAVES["tp"].shapes}),
            {"dense": Mesh({"dp_replicate": 2, "dp_shard": 3})},
            ("dp_replicate", "dp_shard"),
        ),
    ),
    # the experts split on other dims, the dense weight by columns
    "experts_swapped": Load(
        "experts",
        Case(
            SAVES["experts"].shapes,
            ParamLayoutTable(
                {
                    "emb": _dense("tp", S1),
                    "w1": SourceLayout("expert", ["ep", "tp"], [S2, S0]),
                    "w2": SourceLayout("expert", ["ep", "tp"], [S1, S0]),
                }
            ),
            SAVES["experts"].meshes,
        ),
    ),
    # the hazard's checkpoint loaded back into the very layout that saved it
    "hazard_back": Load("hazard", SAVES["hazard"]),
}


def composed(case: Case) -> ParamLayoutTable:
    """The layouts ``case``'s parameters have when saved: through FSDP where it has one."""
    if not case.fsdp:
        return case.table
    fsdp = case.fsdp[0] if len(case.fsdp) == 1 else (case.fsdp[0], case.fsdp[1])
    return compose_table(case.table, fsdp={"dense": fsdp}, mesh_sizes=dict(case.meshes))


def shapes(case: Case) -> dict[str, ParamShape]:
    """Every parameter's shape, all float32."""
    return {fqn: ParamShape(shape, "float32") for fqn, shape in case.shapes.items()}


# ---------------------------------------------------------------------------------------
# one rank


def _model(case: Case, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Module()
    for fqn, shape in case.shapes.items():
        model.register_parameter(fqn, nn.Parameter(torch.randn(shape)))
    return model


def _laid_out(case: Case, factory: MeshFactory, seed: int) -> nn.Module:
    model = _model(case, seed)
    meshes = {role: factory(dict(mesh)) for role, mesh in case.meshes.items()}
    distribute(model, case.table, meshes)
    if case.fsdp:
        dense: DeviceMesh = meshes["dense"]
        fully_shard(model, mesh=dense[case.fsdp] if len(case.fsdp) > 1 else dense[case.fsdp[0]])
    return model


def _differ(model: nn.Module, seed: int, case: Case) -> list[str]:
    """The parameters whose values are not those of the model made with ``seed``."""
    originals = dict(_model(case, seed).named_parameters())
    out: list[str] = []
    for fqn, param in model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
        if not torch.equal(full, originals[fqn].detach()):
            out.append(fqn)
    return out


def run(rank: int, root: str) -> dict[str, object]:
    """One rank: every save, then every load; the reads of each load and what differs."""
    del rank  # every rank runs the same program
    factory = MeshFactory(WORLD_SIZE)
    for i, (name, case) in enumerate(SAVES.items()):
        model = _laid_out(case, factory, seed=i)
        state: dict[str, object] = {**model.state_dict(), "step": 1000 + i}  # bytes beside
        save(state, checkpoint_id=str(Path(root, name)))
    loads: dict[str, object] = {}
    for name, job in LOADS.items():
        fresh = _laid_out(job.into, factory, seed=100)  # other values: the load must bring them
        planner = RecordingPlanner()
        try:
            load(fresh.state_dict(), checkpoint_id=str(Path(root, job.saved)), planner=planner)
        except Exception as e:  # the hazard's checkpoint may not load at all
            loads[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        seed = list(SAVES).index(job.saved)
        loads[name] = {"reads": read_items(planner), "differ": _differ(fresh, seed, job.into)}
    return loads
