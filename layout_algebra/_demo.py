"""The built-in demo: a small MoE transformer, its plan and its layouts on 8 simulated ranks.

The model has an embedding tied to the LM head, attention projections, norms and, in
every block, a mixture of experts with a router and 3-D expert weights. Its plan shards
attention colwise/rowwise over ``tp``, the vocabulary of the tied embedding/head over
``tp``, and the experts over ``ep`` (and their hidden dim over ``tp``).

The world is 8 ranks of torch's fake process group, a mesh ``(dp_shard=2, ep=2, tp=2)``.
Expert parameters live on the whole mesh: FSDP shards them over ``dp_shard``, the source
axes are ``(ep, tp)``. Dense parameters are data-parallel over every rank that holds the
same ``tp`` shard, so FSDP shards them over ``dp``, the flattening of
``(dp_shard, ep)`` (4 ranks); their source axis is ``tp``. This is how an expert-parallel
run borrows its ``ep`` ranks from data parallelism.

A private module of the command line: only this module and the torch bridge import
torch, and the command line imports this module only when ``demo`` runs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Final, TextIO

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

from layout_algebra._text import columns
from layout_algebra.algebra import build_table, complete_default
from layout_algebra.errors import BindError
from layout_algebra.fsdp import compose_fsdp
from layout_algebra.geometry import local_shape_and_offset
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Placement, Shard
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.serialization import to_json
from layout_algebra.torch_bridge import bind, distribute, from_torch

__all__ = ["run"]

WORLD: Final[Mapping[str, int]] = {"dp_shard": 2, "ep": 2, "tp": 2}
"""The simulated world mesh, axes in order; ranks are row-major over it."""

DP: Final = "dp"
"""The flattening of ``(dp_shard, ep)``: the ranks dense parameters are data-parallel over."""

DENSE_AXES: Final[tuple[str, ...]] = (DP, "tp")
"""The dense mesh: FSDP's ``dp`` (4 ranks) and the source axis ``tp``."""

EXPERT_AXES: Final[tuple[str, ...]] = ("dp_shard", "ep", "tp")
"""The expert mesh: the world itself, FSDP's ``dp_shard`` and the source axes ``ep, tp``."""

FSDP_AXIS: Final[Mapping[str, str]] = {"dense": DP, "expert": "dp_shard"}
"""The axis FSDP shards over, by mesh role."""


@attrs.frozen
class DemoConfig:
    """The sizes of the demo model: small, and uneven where it shows something."""

    vocab: int = 50
    """50 rows over tp=2 and then dp=4: 25 per tp shard, cut 7, 7, 7, 4 by FSDP."""
    dim: int = 16
    kv_dim: int = 8
    hidden: int = 24
    experts: int = 4
    layers: int = 2


class RMSNorm(nn.Module):
    """A root-mean-square norm: one learned scale per feature."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    """The four attention projections (keys and values narrower: grouped queries)."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)


class Experts(nn.Module):
    """Every expert's gated MLP at once: 3-D weights, the expert index first."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, cfg.dim))
        self.w2 = nn.Parameter(torch.randn(cfg.experts, cfg.dim, cfg.hidden))
        self.w3 = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, cfg.dim))


class MoE(nn.Module):
    """A router choosing experts per token, and the experts."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.router = nn.Linear(cfg.dim, cfg.experts, bias=False)
        self.experts = Experts(cfg)


class Block(nn.Module):
    """One transformer block: norm, attention, norm, mixture of experts."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim)
        self.moe = MoE(cfg)


class TinyMoE(nn.Module):
    """A small MoE transformer's parameters; the LM head shares the embedding's weight.

    Only the parameters matter to the demo, so the model has no forward.
    """

    def __init__(self, cfg: DemoConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or DemoConfig()
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight


def demo_plan(cfg: DemoConfig | None = None) -> ShardingPlan:
    """The model's plan: what a tensor/expert-parallel planner hands over.

    Colwise ``S(0)`` for ``wq wk wv``, rowwise ``S(1)`` for ``wo``; the tied embedding
    and LM head sharded over the vocabulary; experts ``S(0)`` over ``ep`` and their hidden
    dim over ``tp``. Norms and the router are not mentioned: they are replicated.
    """
    cfg = cfg or DemoConfig()
    colwise: dict[str, Placement] = {"tp": Shard(0)}
    rowwise: dict[str, Placement] = {"tp": Shard(1)}
    modules: dict[str, ModulePlan] = {
        "tok_embeddings": ModulePlan({"weight": colwise}),
        "output": ModulePlan({"weight": colwise}),
    }
    for i in range(cfg.layers):
        modules[f"layers.{i}.attention"] = ModulePlan(
            {
                "wq.weight": colwise,
                "wk.weight": colwise,
                "wv.weight": colwise,
                "wo.weight": rowwise,
            }
        )
        modules[f"layers.{i}.moe"] = ModulePlan(
            {
                "experts.w1": {"ep": Shard(0), "tp": Shard(1)},
                "experts.w2": {"ep": Shard(0), "tp": Shard(2)},
                "experts.w3": {"ep": Shard(0), "tp": Shard(1)},
            },
            expert_parallel=True,
        )
    return ShardingPlan(
        modules,
        mesh_axes=tuple(WORLD),
        tied_pairs=[("tok_embeddings.weight", "output.weight")],
    )


def demo_table(model: nn.Module, plan: ShardingPlan) -> ParamLayoutTable:
    """The plan's table, every other parameter of ``model`` replicated on the dense mesh."""
    table = build_table(plan, DENSE_AXES, expert_axes=EXPERT_AXES)
    fqns = [fqn for fqn, _ in model.named_parameters(remove_duplicate=False)]
    return complete_default(table, fqns, DENSE_AXES)


def mesh_sizes(role: str) -> dict[str, int]:
    """The size of every axis of the role's mesh."""
    if role == "expert":
        return dict(WORLD)
    return {DP: WORLD["dp_shard"] * WORLD["ep"], "tp": WORLD["tp"]}


def rank_coordinate(rank: int, role: str) -> dict[str, int]:
    """The rank's index on every axis of the role's mesh.

    Ranks are row-major over the world ``(dp_shard, ep, tp)``: rank 5 is
    ``dp_shard=1, ep=0, tp=1``; on the dense mesh it is ``dp = 1 * 2 + 0 = 2, tp=1``.
    """
    mesh = Mesh(WORLD)
    world = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
    if role == "expert":
        return world
    return {DP: world["dp_shard"] * WORLD["ep"] + world["ep"], "tp": world["tp"]}


def _composed(layout: SourceLayout) -> SourceLayout:
    return compose_fsdp(
        layout, shard_axis=FSDP_AXIS[layout.mesh], mesh_sizes=mesh_sizes(layout.mesh)
    )


@attrs.frozen
class _Row:
    fqn: str
    shape: tuple[int, ...]
    source: SourceLayout
    composed: SourceLayout
    local: tuple[int, ...]
    offset: tuple[int, ...]


def _rows(model: nn.Module, table: ParamLayoutTable, rank: int) -> list[_Row]:
    rows = []
    for fqn, param in model.named_parameters(remove_duplicate=False):
        source = table[fqn]
        composed = _composed(source)
        shape = tuple(param.shape)
        local, offset = local_shape_and_offset(
            shape, composed, mesh_sizes(source.mesh), rank_coordinate(rank, source.mesh)
        )
        rows.append(_Row(fqn, shape, source, composed, local, offset))
    return rows


def _shape_str(shape: Sequence[int]) -> str:
    return str(tuple(shape))


def _start_world(rank: int) -> tuple[DeviceMesh, DeviceMesh]:
    """The fake 8-rank world with this process as ``rank``: the world mesh and ``dp``."""
    world_size = math.prod(WORLD.values())
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    world = init_device_mesh("cpu", tuple(WORLD.values()), mesh_dim_names=tuple(WORLD))
    dp = world["dp_shard", "ep"]._flatten(DP)
    return world, dp


def _verify(
    model: TinyMoE,
    table: ParamLayoutTable,
    meshes: Mapping[str, DeviceMesh],
    dp: DeviceMesh,
    rows: Sequence[_Row],
) -> list[str]:
    """Distribute and ``fully_shard`` the model; per row, "OK" or what torch says instead."""
    distribute(model, table, meshes)
    for block in model.layers:
        assert isinstance(block, Block)
        fully_shard(block.moe.experts, mesh=meshes["expert"]["dp_shard"])
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    params = dict(model.named_parameters(remove_duplicate=False))
    verdicts = []
    for row in rows:
        param = params[row.fqn]
        if not isinstance(param, DTensor):
            verdicts.append("MISMATCH: torch left a plain tensor")
            continue
        names = tuple(param.device_mesh.mesh_dim_names or ())
        placements = tuple(from_torch(p) for p in param.placements)
        torch_layout = SourceLayout(row.source.mesh, names, placements)
        local = tuple(param.to_local().shape)
        _, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        problems = []
        if torch_layout != row.composed:
            problems.append(f"layout {torch_layout}")
        if local != row.local:
            problems.append(f"local shape {_shape_str(local)}")
        if tuple(offset) != row.offset:
            problems.append(f"offset {_shape_str(offset)}")
        verdicts.append("MISMATCH: torch has " + ", ".join(problems) if problems else "OK")
    return verdicts


def _bind_all(model: nn.Module, table: ParamLayoutTable, meshes: Mapping[str, DeviceMesh]) -> str:
    """Bind the table onto the model; what was bound. Every parameter must get a binding.

    Raises:
        BindError: an FQN of the table the model lacks, or a parameter left unbound.
    """
    bindings = bind(table, model, meshes)
    fqns = [fqn for fqn, _ in model.named_parameters(remove_duplicate=False)]
    unbound = [
        fqn for fqn, p in model.named_parameters(remove_duplicate=False) if p not in bindings
    ]
    if unbound:
        msg = f"{unbound[0]}: the demo table gives this parameter no layout; complete the table"
        raise BindError(msg, fqn=unbound[0])
    return (
        f"bound the table onto the model: {len(fqns)} FQNs, {len(bindings)} distinct "
        "parameters, every FQN matched"
    )


def run(
    *, rank: int = 0, verify: bool = False, as_json: bool = False, out: TextIO = sys.stdout
) -> int:
    """Run the demo as process ``rank`` of the simulated world; the exit status.

    Args:
        rank: the rank this process plays, whose local shapes are shown (0-7).
        verify: also distribute the model, apply ``fully_shard`` and compare every
            predicted layout, local shape and offset with torch's.
        as_json: print the table as JSON instead of the report.
        out: where to print.

    Returns:
        0, or 1 when ``verify`` found a mismatch.
    """
    with torch.device("meta"):
        model = TinyMoE()
    plan = demo_plan()
    table = demo_table(model, plan)
    world, dp = _start_world(rank)
    try:
        meshes = {"dense": world, "expert": world}
        bound = _bind_all(model, table, meshes)
        if as_json:
            out.write(to_json(table) + "\n")
            return 0
        rows = _rows(model, table, rank)
        verdicts = _verify(model, table, meshes, dp, rows) if verify else None
        _report(out, rank=rank, table=table, rows=rows, verdicts=verdicts, bound=bound)
        return 1 if verdicts is not None and any(v != "OK" for v in verdicts) else 0
    finally:
        dist.destroy_process_group()


def _report(
    out: TextIO,
    *,
    rank: int,
    table: ParamLayoutTable,
    rows: Sequence[_Row],
    verdicts: Sequence[str] | None,
    bound: str,
) -> None:
    world = ", ".join(f"{a}={n}" for a, n in WORLD.items())
    dense = ", ".join(f"{a}={n}" for a, n in mesh_sizes("dense").items())
    coord = rank_coordinate(rank, "expert")
    dense_coord = rank_coordinate(rank, "dense")
    out.write(f"TinyMoE on a simulated world of 8 ranks, mesh ({world}), fake process group\n")
    out.write(f"  expert mesh ({world}): FSDP over dp_shard, source axes ep, tp\n")
    out.write(f"  dense mesh ({dense}): FSDP over dp = dp_shard x ep flattened, source axis tp\n")
    out.write(f"  {bound}\n")
    out.write(
        f"  local shapes on rank {rank}: "
        + ", ".join(f"{a}={i}" for a, i in coord.items())
        + " (dense: "
        + ", ".join(f"{a}={i}" for a, i in dense_coord.items())
        + ")\n\n"
    )
    header = ["FQN", "shape", "source layout", "with FSDP", f"local (rank {rank})"]
    if verdicts is not None:
        header.append("torch")
    lines = [header]
    for i, row in enumerate(rows):
        cells = [
            row.fqn,
            _shape_str(row.shape),
            str(row.source),
            str(row.composed),
            _shape_str(row.local),
        ]
        if verdicts is not None:
            cells.append(verdicts[i])
        lines.append(cells)
    for line in columns(lines):
        out.write(line + "\n")
    for group in table.tied:
        out.write(f"\ntied (one storage): {', '.join(sorted(group))}\n")
    if verdicts is not None:
        bad = sum(v != "OK" for v in verdicts)
        out.write(
            f"\nverify: distribute + fully_shard on the fake process group: "
            f"{len(verdicts) - bad}/{len(verdicts)} OK" + (f", {bad} MISMATCH\n" if bad else "\n")
        )
