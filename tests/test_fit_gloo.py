"""``fit``'s rows against real training steps on 4 gloo ranks, and the meshes it skips
against what torch does with them.

Two searches of a world of 4: transformers' Llama (4 attention heads, 2 KV heads) over
``dp_replicate``, ``dp_shard`` and ``tp``, and its Qwen3-MoE (4 experts) over
``dp_shard``, ``tp`` and ``ep`` (pipelines and ``cp``, which shard no parameter, are left
to their own tests). Their plans are the one the step oracle applies: torch's
``parallelize_module`` over the attention (``table_from_parallelize`` reads it), the
experts on ``ep`` (``distribute``). One spawn runs every row as the step oracle runs a
case (``tests/step_oracle.py``: torch's ``fully_shard`` with the units of the search,
AdamW): each runs without error; what each rank allocates, keeps and sends equals what
lint says of the row's mesh; and a steady step (after ``zero_grad(set_to_none=True)``)
under torch's own ``FSDPMemTracker`` holds at most the row's peak of what the step is
made of (parameters, gradients, optimizer states and FSDP2's buffers; no activations
are given to the search), but for one unit's reduce-scatter input, which torch 2.13
keeps in flight past the next unit's unshard and lint's step does not (an expected
failure, strict, says where).

The same spawn runs what ``fit`` skips: tensor parallelism over 4 ranks of 2 KV heads
(its ``cuts-unit``), which torch cannot run; and 6 experts over ``ep=4`` (``experts``),
which transformers' own expert parallelism refuses and torch's ``Shard(0)`` leaves a rank
without an expert.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Final

import attrs
import pytest
import torch
from torch import nn
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.placement_types import Shard as TorchShard

from layout_algebra import (
    FitReport,
    FitRow,
    Mesh,
    ParamLayoutTable,
    Shard,
    SourceLayout,
    Training,
    fit,
    lint,
)
from layout_algebra.torch_bridge import shapes_from_module, table_from_parallelize
from tests import step_oracle
from tests.step_oracle import Case, Unit
from tests.test_fit import in_order
from tests.torch_oracle import MeshFactory, on_gloo

pytestmark = pytest.mark.distributed

WORLD: Final = 4
LLAMA: Final = Case("llama", (("dp_shard", WORLD),), "dp_shard", units=(Unit(("model.layers.*",)),))
MOE: Final = Case(
    "qwen3_moe",
    (("dp_shard", WORLD),),
    "dp_shard",
    units=(Unit(("model.layers.*.mlp.experts",)), Unit(("model.layers.*",))),
)
SEARCHES: Final[Mapping[str, tuple[Case, tuple[str, ...]]]] = {
    "llama": (LLAMA, ("dp_replicate", "dp_shard", "tp")),
    "qwen3-moe": (MOE, ("dp_shard", "tp", "ep")),
}
"""Each search: the model (as the step oracle builds it) and the degrees searched."""

TRACKED: Final = ("Sharded Param", "Sharded Grad", "Unsharded Grad", "Reduce Scatter", "OptState")
"""``FSDPMemTracker``'s categories of what the step's peak is made of (no activations are
given to the searches), but FSDP2's buffers: the tracker files a unit's unsharded
parameters under their name late and frees them late (``reshard`` resizes their storage
outside any op it sees), so their bytes are read off their storages at each op."""


def _meta(case: Case) -> nn.Module:
    with torch.device("meta"):
        return step_oracle._transformers(case)


def _plan_for(case: Case, model: nn.Module) -> Any:
    """The step oracle's layout of ``case`` on any meshes, as a table."""

    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        dense = meshes["dense"]
        if dense.get("tp", 1) > 1:
            table = table_from_parallelize(model, step_oracle._tp_plan(case), mesh_axes=dense)
        else:
            table = ParamLayoutTable(
                {fqn: SourceLayout("dense", (), ()) for fqn, _ in model.named_parameters()}
            )
        if "expert" in meshes:
            experts = SourceLayout("expert", ["ep"], [Shard(0)])
            table = table.with_entries({f: experts for f in table if ".experts." in f})
        return table

    return plan_for


def _training(case: Case) -> Training:
    return Training(units=[unit.modules[0] for unit in case.units], optimizer=case.optimizer)


def search(name: str, **changes: Any) -> FitReport:
    """``fit`` of the search ``name`` on the world, every mesh that fits listed."""
    case, axes = SEARCHES[name]
    model = _meta(case)
    return fit(
        shapes_from_module(model),
        ranks=WORLD,
        budget=2**30,
        training=_training(case),
        plan_for=_plan_for(case, model),
        axes=axes,
        top=100,
        **changes,
    )


def case_of(base: Case, row: FitRow) -> Case:
    """The step oracle's case running ``row``'s meshes."""
    dense = row.mesh["dense"]
    expert = row.mesh.get("expert")
    return attrs.evolve(
        base,
        mesh=dense.axes,
        fsdp=("dp_replicate", "dp_shard") if "dp_replicate" in dense else "dp_shard",
        tp=dense.get("tp", 1) > 1,
        expert_mesh=() if expert is None else expert.axes,
    )


# ---------------------------------------------------------------------------------------
# on every rank


class _Peak(step_oracle._Tracker):  # type: ignore[no-untyped-call]  # torch's mode hook is unannotated
    """torch's ``FSDPMemTracker``, keeping after every op the most the step's own memory
    holds at once: its tracked categories, and FSDP2's buffers as their storages hold
    them (``buffers``, the step oracle's reading)."""

    def __init__(
        self, mod: nn.Module, optm: torch.optim.Optimizer, buffers: step_oracle._Buffers
    ) -> None:
        super().__init__(mod, optm)
        self.buffers = buffers
        self.modelled = 0

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)
        held = sum(self.buffers.live())
        for snap in self._curr_mem_snap.values():
            named = step_oracle._named(snap)
            self.modelled = max(self.modelled, held + sum(named.get(k, 0) for k in TRACKED))


def _run(case: Case, meshes: MeshFactory) -> dict[str, Any]:
    """The step oracle's measure of one step, then a steady step under the tracker."""
    model, _ = step_oracle._build(case, meshes)
    step_oracle._wrap(case, model, meshes)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = step_oracle._OPTIMIZERS[case.optimizer](trainable)
    tokens = step_oracle._tokens(case)
    measured = step_oracle.measure_step(model, optimizer, tokens)
    optimizer.zero_grad(set_to_none=True)
    buffers = step_oracle._Buffers(step_oracle._groups(model))
    tracker = _Peak(model, optimizer, buffers)
    with (
        tracker,
        buffers.watching(),
        step_oracle._collectives() as seen,
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", "The module hierarchy tracking", UserWarning)
        step_oracle._step(model, optimizer, tokens)
    measured["modelled_peak"] = tracker.modelled
    measured["largest_reduce_scatter"] = max((b for b, _ in seen["reduce_scatter"]), default=0)
    return measured


def _cut_heads(meshes: MeshFactory) -> str | None:
    """Tensor parallelism over 4 ranks of the Llama's 2 KV heads: what torch says."""
    case = attrs.evolve(LLAMA, mesh=(("dp_shard", 1), ("tp", WORLD)), tp=True)
    model, _ = step_oracle._build(case, meshes)
    try:
        model(step_oracle._tokens(case))
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


def _idle_experts(rank: int) -> dict[str, Any]:
    """6 experts over ``ep=4``: transformers' own expert parallelism, and torch's
    ``Shard(0)`` of the experts' weight."""
    import transformers  # noqa: PLC0415 - only where it is used
    from transformers.distributed.configuration_utils import DistributedConfig  # noqa: PLC0415
    from transformers.distributed.expert_parallel import apply_expert_parallelism  # noqa: PLC0415
    from transformers.distributed.utils import initialize_distributed_mesh  # noqa: PLC0415

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**_six_experts())
    model = transformers.Qwen3MoeForCausalLM(config)
    distributed = DistributedConfig(tp_size=1, fsdp_size=WORLD, ep_size=WORLD)
    _, mesh = initialize_distributed_mesh(distributed)
    assert mesh is not None
    _, ep_plan, _ = model._resolve_parallel_plans(distributed)
    model._mesh_manager = mesh
    try:
        apply_expert_parallelism(model, mesh.get_mesh("ep"), mesh.get_mesh("tp"), ep_plan)
        refused = None
    except ValueError as e:
        refused = str(e)
    weight = model.model.layers[0].mlp.experts.down_proj.detach()
    local = distribute_tensor(weight, mesh.get_mesh("ep"), [TorchShard(0)]).to_local()
    return {"refused": refused, "experts": local.shape[0], "rank": rank}


def _six_experts() -> dict[str, Any]:
    return {
        "vocab_size": 16,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 4,
        "moe_intermediate_size": 8,
        "num_experts": 6,
        "num_experts_per_tok": 2,
    }


def scenario(rank: int, cases: dict[str, Case]) -> dict[str, Any]:
    meshes = MeshFactory(WORLD)
    out: dict[str, Any] = {name: _run(case, meshes) for name, case in cases.items()}
    out["cut heads"] = _cut_heads(meshes)
    out["idle experts"] = _idle_experts(rank)
    return out


# ---------------------------------------------------------------------------------------
# the checks


@pytest.fixture(scope="module")
def rows() -> dict[str, tuple[Case, FitRow]]:
    """Every row of both searches, by a name, with the case that runs it."""
    out: dict[str, tuple[Case, FitRow]] = {}
    for name, (base, _) in SEARCHES.items():
        for row in search(name).rows:
            meshes = "; ".join(f"{role} {mesh}" for role, mesh in row.mesh.items())
            out[f"{name}: {meshes}"] = (case_of(base, row), row)
    return out


@pytest.fixture(scope="module")
def measured(rows: dict[str, tuple[Case, FitRow]]) -> list[dict[str, Any]]:
    """Every row's step, and what fit skips, on every rank: one spawn."""
    return on_gloo(scenario, {name: case for name, (case, _) in rows.items()}, world_size=WORLD)


def test_the_searches_list_every_mesh_they_do_not_skip(
    rows: dict[str, tuple[Case, FitRow]],
) -> None:
    llama, moe = search("llama"), search("qwen3-moe")
    # 4 ranks over 3 degrees, tp=4 cutting the 2 KV heads
    assert (llama.candidates, dict(llama.pruned), len(llama.rows)) == (6, {"cut heads": 1}, 5)
    # ep borrows from dp_shard * tp: tp in {1, 2} (tp=4 cuts), ep in {1, 2, 4}
    assert (moe.candidates, dict(moe.pruned), len(moe.rows)) == (9, {"cut heads": 3}, 6)
    assert len(rows) == 11


def test_every_row_runs_a_step_as_lint_says_of_its_mesh(
    rows: dict[str, tuple[Case, FitRow]], measured: list[dict[str, Any]]
) -> None:
    """Each row's step ran on every rank, and what each rank allocates, keeps and sends
    is what lint says of the row's mesh; the step's highest point is within the row's
    peak but for one unit's reduce-scatter input (see the next test)."""
    for name, (case, row) in rows.items():
        base, _ = SEARCHES[name.split(":")[0]]
        model = _meta(base)
        fsdp: dict[str, str | tuple[str, str]] = {"dense": case.fsdp}
        if "expert" in row.mesh:
            fsdp["expert"] = "efsdp"
        shapes = shapes_from_module(model)
        report = lint(
            in_order(_plan_for(base, model)(row.mesh), shapes),
            shapes,
            mesh_sizes=dict(row.mesh),
            fsdp=fsdp,
            training=_training(base),
        )
        assert report.ok, (name, report.problems)
        assert max(report.memory.peak) == row.peak, name
        for rank, by_rank in enumerate(measured):
            got = by_rank[name]
            for kind in ("params", "grads", "optimizer"):
                assert got[kind] == report.memory.by_kind[kind][rank], (name, rank, kind)
            assert got["buffers_peak"] == report.memory.by_kind["transient"][rank], (name, rank)
            for collective in ("all_gather", "reduce_scatter", "all_reduce"):
                assert got[collective] == report.traffic[collective][rank], (name, collective)
                assert got[collective] <= row.traffic[collective]
            held = got["modelled_peak"] - got["largest_reduce_scatter"]
            assert 0 < held <= row.peak, (name, rank, got["modelled_peak"])


def test_every_rows_step_is_within_its_peak(
    rows: dict[str, tuple[Case, FitRow]], measured: list[dict[str, Any]]
) -> None:
    over = [
        (name, rank, by_rank[name]["modelled_peak"] - row.peak)
        for name, (_, row) in rows.items()
        for rank, by_rank in enumerate(measured)
        if by_rank[name]["modelled_peak"] > row.peak
    ]
    assert not over, over


def test_a_mesh_skipped_for_cutting_heads_does_not_run_in_torch(
    measured: list[dict[str, Any]],
) -> None:
    report = search("llama")
    assert "tp=4 does not divide the 2 heads" in report.examples["cut heads"]
    for by_rank in measured:
        refused = by_rank["cut heads"]
        assert refused is not None and "invalid for input of size" in refused, refused


def test_a_mesh_skipped_for_its_experts_is_refused_or_idle_in_torch(
    measured: list[dict[str, Any]],
) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: PLC0415

    with torch.device("meta"):
        six = Qwen3MoeForCausalLM(Qwen3MoeConfig(**_six_experts()))
    report = fit(
        shapes_from_module(six),
        ranks=WORLD,
        budget=2**30,
        training=Training(units=["model.layers.*"]),
        plan_for=_plan_for(MOE, six),
        axes=("dp_shard", "ep"),
        top=100,
    )
    assert dict(report.pruned) == {"experts": 1}  # ep=4; ep=2 divides 6 and is a row
    assert "ep=4 does not divide the 6 experts" in report.examples["experts"]
    assert sorted(str(r.mesh.get("expert", "")) for r in report.rows) == ["", "efsdp=2,ep=2"]
    seen = [by_rank["idle experts"] for by_rank in measured]
    assert all("Cannot evenly shard 6 experts across 4" in (s["refused"] or "") for s in seen)
    assert sorted(s["experts"] for s in seen) == [0, 2, 2, 2]  # one rank holds none
