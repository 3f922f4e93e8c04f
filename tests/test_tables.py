"""``table_from_hf`` and ``table_from_parallelize``: a model's complete table in one call,
equal to what transformers' own parallelism and torch's ``parallelize_module`` give."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from layout_algebra import LayoutError, Mesh, ParamLayoutTable
from layout_algebra.torch_bridge import table_from_hf, table_from_module, table_from_parallelize
from tests import test_parallelize as tp_cases
from tests import test_transformers as hf_cases
from tests.torch_oracle import MeshFactory

pytestmark = pytest.mark.usefixtures("fake_world")


@pytest.mark.parametrize("case", list(hf_cases.CASES))
def test_table_from_hf_is_what_transformers_gives(case: str) -> None:
    build, run = hf_cases.CASES[case]
    model = build()
    expert = hf_cases.EXPERT if run.ep > 1 else None
    table = table_from_hf(model, mesh_axes=hf_cases.DENSE, expert_axes=expert)
    assert table == run.predicted(model)  # the composition it is
    hf_cases.transformers_tp_ep(model, run)
    roles = hf_cases.roles(hf_cases.meshes(run))
    assert table_from_module(model, roles=roles) == table


def test_table_from_hf_takes_meshes_and_reads_the_tp_size_from_them() -> None:
    build, run = hf_cases.CASES["qwen3-moe tp=2 ep=4"]
    model = build()
    dense = Mesh({"fsdp": run.fsdp, "tp": run.tp})
    expert = Mesh({"efsdp": run.efsdp, "ep": run.ep})
    assert table_from_hf(model, mesh_axes=dense, expert_axes=expert) == run.predicted(model)


@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sp", "no-sp"])
@pytest.mark.parametrize("which", list(tp_cases.MODELS))
def test_table_from_parallelize_is_what_parallelize_module_gives(
    which: str, sequence_parallel: bool, world_mesh: MeshFactory
) -> None:
    build, make_plan = tp_cases.MODELS[which]
    model = build()
    plan = make_plan(sequence_parallel=sequence_parallel)
    table = table_from_parallelize(model, plan, mesh_axes=Mesh(tp_cases.MESH))
    world: DeviceMesh = world_mesh(tp_cases.MESH)
    assert tp_cases.torch_table(model, plan, world) == table


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight


@pytest.mark.parametrize(
    "plan",
    [
        {"emb": RowwiseParallel(), "head": ColwiseParallel()},
        {"up": ColwiseParallel(), "down": RowwiseParallel()},
    ],
    ids=["untied-by-torch", "tie-kept"],
)
def test_ties_are_as_torch_keeps_them(
    plan: dict[str, ParallelStyle], world_mesh: MeshFactory
) -> None:
    with torch.device("meta"):
        model = Tied()
    table = table_from_parallelize(model, plan, mesh_axes=["dp_shard", "tp"])
    assert set(table) == {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert tp_cases.torch_table(model, plan, world_mesh(tp_cases.MESH)) == table


BAD: list[tuple[str, Callable[[nn.Module], ParamLayoutTable]]] = [
    ("bare string axes", lambda m: table_from_parallelize(m, {}, mesh_axes="tp")),
    ("no axes", lambda m: table_from_parallelize(m, {}, mesh_axes=None)),  # type: ignore[arg-type]
    ("typo'd axis", lambda m: table_from_parallelize(m, {}, mesh_axes=["t-p"])),
    ("not a module", lambda m: table_from_parallelize(None, {}, mesh_axes=["tp"])),  # type: ignore[arg-type]
    ("hf bare string", lambda m: table_from_hf(m, mesh_axes="tp")),
    ("hf not transformers", lambda m: table_from_hf(m, mesh_axes=["tp"])),
    ("hf expert str", lambda m: table_from_hf(m, mesh_axes=["tp"], expert_axes="ep")),
]


@pytest.mark.parametrize("name", [n for n, _ in BAD])
def test_bad_arguments_are_layout_errors(name: str) -> None:
    call = dict(BAD)[name]
    with torch.device("meta"):
        model = Tied()
    with pytest.raises(LayoutError):
        call(model)
