"""Whole-table FSDP composition, FSDP2's real storage and the lint, against torch itself.

The oracles: the placements torch's ``fully_shard`` gives every parameter of a model laid
out by a table (fake 8-rank process group); the rows each rank really keeps after
``distribute_tensor`` and ``fully_shard`` (values = global flat index); the per-rank bytes
of real transformers models after their plan and ``fully_shard``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Shard as TorchShard

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_table,
)
from layout_algebra.torch_bridge import to_torch
from tests.torch_oracle import MeshFactory, layout_of

S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()


def lay_out(param: nn.Parameter, layout: SourceLayout, mesh: DeviceMesh) -> nn.Parameter:
    """``param`` as torch's ``distribute_tensor`` lays it out (a plain layout stays plain)."""
    if not layout.axes:
        return param
    names = tuple(a.name for a in layout.axes)
    sub = mesh[names[0]] if len(names) == 1 else mesh[names]
    placements = [to_torch(p) for p in layout.placements]
    return nn.Parameter(distribute_tensor(param.detach(), sub, placements))


# ---------------------------------------------------------------------------------------
# compose_table against fully_shard


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, 16, 6))
        self.w2 = nn.Parameter(torch.randn(4, 6, 16))


class MoE(nn.Module):
    """A tied embedding and head, TP linears, a plain norm and a block of experts."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.up = nn.Linear(8, 10)
        self.down = nn.Linear(10, 8)
        self.norm = nn.LayerNorm(8)
        self.experts = Experts()
        self.head = nn.Linear(8, 12, bias=False)
        self.head.weight = self.emb.weight


MOE_TABLE = ParamLayoutTable(
    {
        "emb.weight": SourceLayout("dense", ["tp"], [S0]),
        "up.weight": SourceLayout("dense", ["tp"], [S0]),
        "up.bias": SourceLayout("dense", ["tp"], [S0]),
        "down.weight": SourceLayout("dense", ["tp"], [S1]),
        "down.bias": SourceLayout("dense", ["tp"], [R]),
        "norm.weight": SourceLayout("dense", (), ()),
        "norm.bias": SourceLayout("dense", (), ()),
        "experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S1]),
        "experts.w2": SourceLayout("expert", ["ep", "tp"], [S0, S2]),
        "head.weight": SourceLayout("dense", ["tp"], [S0]),
    },
    tied=[frozenset({"emb.weight", "head.weight"})],
)

DENSE_FSDP = {"dp_shard": 4, "tp": 2}
DENSE_HSDP = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
EXPERT = {"edp_shard": 2, "ep": 2, "tp": 2}


@pytest.mark.parametrize(
    ("dense_sizes", "dense_fsdp", "expert_dim"),
    [
        (DENSE_FSDP, "dp_shard", 0),
        (DENSE_HSDP, ("dp_replicate", "dp_shard"), 0),
        (DENSE_FSDP, "dp_shard", 1),
    ],
    ids=["fsdp", "hsdp", "experts-on-dim-1"],
)
def test_compose_table_predicts_fully_shard(
    world_mesh: MeshFactory,
    dense_sizes: dict[str, int],
    dense_fsdp: str | tuple[str, str],
    expert_dim: int,
) -> None:
    meshes = {"dense": world_mesh(dense_sizes), "expert": world_mesh(EXPERT)}
    model = MoE()
    for fqn, layout in MOE_TABLE.items():
        module_name, _, name = fqn.rpartition(".")
        module = model.get_submodule(module_name)
        if fqn != "head.weight":  # an alias of emb.weight: laid out once, kept tied below
            setattr(module, name, lay_out(getattr(module, name), layout, meshes[layout.mesh]))
    model.head.weight = model.emb.weight
    fully_shard(
        model.experts,
        mesh=meshes["expert"]["edp_shard"],
        shard_placement_fn=lambda _: TorchShard(expert_dim),
    )
    dense_axes = (dense_fsdp,) if isinstance(dense_fsdp, str) else dense_fsdp
    fully_shard(model, mesh=meshes["dense"][dense_axes])

    composed = compose_table(
        MOE_TABLE,
        fsdp={"dense": dense_fsdp, "expert": "edp_shard"},
        mesh_sizes={"dense": dense_sizes, "expert": EXPERT},
        shard_dim={"experts.w1": expert_dim, "experts.w2": expert_dim},
    )
    assert list(composed) == list(MOE_TABLE)
    assert composed.tied == MOE_TABLE.tied
    assert model.head.weight is model.emb.weight
    for fqn, param in model.named_parameters(remove_duplicate=False):
        role = MOE_TABLE[fqn].mesh
        assert isinstance(param, DTensor)
        assert composed[fqn] == layout_of(param, role), fqn


def test_a_plain_parameter_gets_fsdps_own_placements() -> None:
    table = ParamLayoutTable({"norm.weight": SourceLayout("dense", (), ())})
    composed = compose_table(
        table, fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": {"dp_shard": 8}}
    )
    assert composed["norm.weight"] == SourceLayout("dense", ["dp_shard"], [S0])


def test_compose_table_strides_where_the_source_shards_fsdps_dim() -> None:
    table = ParamLayoutTable({"w": SourceLayout("expert", ["ep", "tp"], [S0, S0])})
    composed = compose_table(
        table,
        fsdp={"expert": "dp_shard"},
        mesh_sizes={"expert": {"dp_shard": 2, "ep": 2, "tp": 2}},
    )
    assert composed["w"].placements == (StridedShard(0, split_factor=4), S0, S0)


# ---------------------------------------------------------------------------------------
# compose_table: every problem at once, named


def test_compose_table_reports_every_parameter_it_cannot_compose() -> None:
    table = ParamLayoutTable(
        {
            "a": SourceLayout("expert", ["ep"], [S0]),  # no FSDP axis for 'expert'
            "b": SourceLayout("dense", ["dp_shard"], [S0]),  # composed already
            "c": SourceLayout("dense", ["tp", "ep", "sp"], [S0, R, R]),  # too wide for FSDP2
            "d": SourceLayout("dense", ["tp"], [S0]),
        }
    )
    sizes = {"dense": {"dp_shard": 1, "tp": 2, "ep": 2, "sp": 2}}
    with pytest.raises(PlanError) as caught:
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes)
    problems = caught.value.problems
    assert [p.fqn for p in problems] == ["a", "b", "c"]
    assert "no FSDP axis for mesh role 'expert'" in problems[0].message
    assert "fsdp={'expert'" in problems[0].message
    assert "owned by FSDP" in problems[1].message
    assert problems[1].axis == "dp_shard"
    assert problems[1].placement == "S(0)"
    assert problems[2].message.startswith("c: ")
    assert "at most 2 source axes" in problems[2].message
    assert "3 problems" in str(caught.value)


def test_owned_replaces_the_owned_axes() -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["cp"], [S0])})
    sizes = {"dense": {"dp_shard": 4, "cp": 2}}
    with pytest.raises(PlanError, match=r"'cp'.*owned by FSDP"):
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes)
    composed = compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, owned=["dp"])
    assert composed["w"].placements == (StridedShard(0, split_factor=2), S0)


def test_tied_members_share_one_shard_dim() -> None:
    layout = SourceLayout("dense", ["tp"], [R])
    table = ParamLayoutTable({"emb": layout, "head": layout}, tied=[frozenset({"emb", "head"})])
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    with pytest.raises(PlanError, match=r"tied group \['emb', 'head'\].*same shard_dim"):
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, shard_dim={"emb": 1})
    both = compose_table(
        table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, shard_dim={"emb": 1, "head": 1}
    )
    assert both["emb"] == both["head"] == SourceLayout("dense", ["dp_shard", "tp"], [S1, R])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fsdp": "dp_shard"}, "fsdp must map each mesh role"),
        ({"fsdp": {"dense": ["dp_shard"]}}, r"fsdp\['dense'\] must be FSDP's shard axis"),
        ({"fsdp": {"dense": ("dp_shard", "dp_shard")}}, "replicates and shards over one axis"),
        ({"mesh_sizes": {"dp_shard": 8}}, r"mesh_sizes\['dp_shard'\] must map axis name"),
        (
            {"mesh_sizes": {"dense": {"dp_shard": 8}, "expert": {"ep": 4}}},
            "every role's mesh spans the whole world",
        ),
        ({"shard_dim": {"nope": 1}}, "shard_dim names 'nope', which is not a parameter"),
        ({"shard_dim": -1}, "shard_dim must be an int >= 0"),
        ({"shard_dim": {"w": "1"}}, r"w: shard_dim must be an int >= 0, got '1'"),
    ],
)
def test_compose_table_arguments(kwargs: dict[str, object], match: str) -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", (), ())})
    args: dict[str, object] = {
        "fsdp": {"dense": "dp_shard"},
        "mesh_sizes": {"dense": {"dp_shard": 8}},
        **kwargs,
    }
    with pytest.raises(LayoutError, match=match):
        compose_table(table, **args)  # type: ignore[arg-type]


def test_compose_table_wants_a_table() -> None:
    with pytest.raises(LayoutError, match="table must be a ParamLayoutTable"):
        compose_table({"w": SourceLayout("dense", (), ())}, fsdp={}, mesh_sizes={})  # type: ignore[arg-type]
