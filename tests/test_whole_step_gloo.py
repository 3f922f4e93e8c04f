"""``lint(..., training=Training(activations=...))`` against a whole step on 4 gloo ranks.

One spawn (``tests/whole_step_oracle.py``) runs, on every rank, transformers' Llama and
Qwen3-MoE under tensor parallelism and FSDP2 (``dp_shard=2 x tp=2``), with and without
full activation checkpointing; a two-stage ``torch.distributed.pipelining`` step on
``pp=2 x dp_shard=2`` under GPipe and 1F1B with 2 and 4 microbatches; and, where
torchtitan is installed, its Qwen3-MoE under its own expert parallelism (``ep=2``).
The package's side is what a planner gives it: the source table and shapes, and the
activations ``activations_from_module`` traces on the model on the meta device.

On every rank:

- ``memory.by_kind["activations"]`` equals the bytes autograd saves in the model's
  forward (each storage once, parameters left out), unit by unit, exactly;
- ``memory.peak`` is within 10% of ``FSDPMemTracker``'s peak over a steady step (the
  tracker also counts what no part of the package's model holds: the logits, the loss's
  tensors, the optimizer step's temporaries, the tokens);
- ``traffic["tp"]`` equals the bytes DTensor hands its all-reduces in forward and
  backward, the recompute of checkpointed layers included;
- under stages, ``memory.by_kind["params"]`` equals the storage of the stage's
  parameters, ``traffic["pp_send_recv"]`` the bytes handed to the send ops, and
  ``memory.by_kind["activations"]`` the most autograd holds at once for the stage's
  forwards, exactly (but one stated difference of the token ids);
- ``traffic["ep_all_to_all"]`` equals the bytes of token rows torchtitan hands its
  all-to-alls (routing balanced by its router's round-robin), with full checkpointing
  and without.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

import pytest
import torch

from layout_algebra import (
    Activations,
    LintReport,
    Mesh,
    ParamLayoutTable,
    SourceLayout,
    Stages,
    Training,
    lint,
)
from layout_algebra.serialization import from_json, shapes_from_json
from layout_algebra.stages import assign_stages
from layout_algebra.torch_bridge import (
    activations_from_module,
    shapes_from_module,
    table_from_torchtitan,
)
from tests.whole_step_oracle import (
    BATCH,
    DENSE,
    EXPERT_MESHES,
    MICROBATCH,
    PIPE,
    PIPE_SEQ,
    PIPELINES,
    RUNS,
    SEQ,
    STAGES,
    WORLD_SIZE,
    PipeNet,
    dense_model,
    has_torchtitan,
    run_all,
    titan_moe,
)

pytestmark = [
    pytest.mark.distributed,
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    # torchtitan's router asks CPU autocast for float32, which it declines (and so runs as is)
    pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported"),
]

Measured = list[dict[str, Any]]

TOLERANCE: Final = 0.10
"""The peak's: FSDPMemTracker counts every tensor alive, and the package the model
state, FSDP2's buffers, the activations and the gradients; the rest (logits, the loss's
tensors, the optimizer's temporaries, the tokens) is what the two may differ by."""


@pytest.fixture(scope="module")
def measured() -> Measured:
    """Every run on every rank: one spawn for the whole module."""
    return run_all(experts=has_torchtitan())


# ---------------------------------------------------------------------------------------
# tensor parallelism and FSDP2: activations, peak, TP traffic


@functools.cache
def _traced(name: str) -> Activations:
    """What the package is given of the run's activations: traced on the meta device."""
    run = RUNS[name]
    model = dense_model(run.model)
    return activations_from_module(model, batch=BATCH, seq_len=SEQ, checkpointing=run.checkpointing)


def _dense_report(name: str, rank0: Mapping[str, Any]) -> LintReport:
    return lint(
        from_json(rank0["table"]),
        shapes_from_json(rank0["shapes"]),
        mesh_sizes={"dense": DENSE},
        fsdp={"dense": "dp_shard"},
        training=Training(units=["model.layers.*"], optimizer="adamw", activations=_traced(name)),
    )


@pytest.fixture(scope="module")
def dense_reports(measured: Measured) -> dict[str, LintReport]:
    return {name: _dense_report(name, measured[0]["dense"][name]) for name in RUNS}


@pytest.mark.parametrize("name", RUNS)
def test_activations_equal_the_saved_bytes_of_torchs_run_on_every_rank(
    measured: Measured, dense_reports: dict[str, LintReport], name: str
) -> None:
    """Unit by unit, what one rank keeps of each traced unit (``Activations.shares``
    under tp=2) equals what autograd saved on that rank while the unit's modules ran;
    ``by_kind["activations"]`` equals their sum. Exact: the loss, whose tensors are not
    traced, runs outside the measured forward too."""
    run = RUNS[name]
    shares = _traced(name).shares(tp=DENSE["tp"])
    report = dense_reports[name]
    for rank in range(WORLD_SIZE):
        saved: dict[str, int] = measured[rank]["dense"][name]["saved"]
        by_unit = {unit: sum(saved.get(m, 0) for m in unit.split(",")) for unit in shares}
        assert by_unit == shares, (name, rank)
        assert sum(saved.values()) == sum(by_unit.values())  # nothing saved elsewhere
        assert report.memory.by_kind["activations"][rank] == sum(saved.values()), (name, rank)
    if run.checkpointing == "full":  # a layer keeps its input alone: 2 x 16 tokens x 16
        width = 4 if run.model == "llama" else 2  # float32, bfloat16
        assert all(shares[f"model.layers.{i}"] == BATCH * SEQ * 16 * width for i in range(2))


@pytest.mark.parametrize("name", RUNS)
def test_peak_is_within_ten_percent_of_fsdp_mem_tracker(
    measured: Measured, dense_reports: dict[str, LintReport], name: str
) -> None:
    """``memory.peak`` against the total of ``FSDPMemTracker``'s peak snapshot over the
    second step, within ``TOLERANCE``. Its ``Activation`` category is printed beside,
    not compared: it holds every tensor made in a module's forward that is still alive
    (outputs not saved, the logits), at the tracker's own peak, in backward, when some
    units' activations are freed already."""
    report = dense_reports[name]
    rows = []
    for rank in range(WORLD_SIZE):
        tracker = measured[rank]["dense"][name]["tracker"]
        peak, total = report.memory.peak[rank], tracker["Total"]
        rows.append(
            f"rank {rank}: package {peak} (activations "
            f"{report.memory.by_kind['activations'][rank]}), FSDPMemTracker {total} "
            f"(Activation {tracker['Activation']}, Temp {tracker['Temp']}), "
            f"{(peak - total) / total:+.1%}"
        )
        assert abs(peak - total) <= TOLERANCE * total, "\n".join(rows)
    print(f"\n{name}:", *rows, sep="\n  ")


@pytest.mark.parametrize("name", RUNS)
def test_tp_traffic_equals_dtensors_all_reduces(
    measured: Measured, dense_reports: dict[str, LintReport], name: str
) -> None:
    """No sequence parallelism: tensor parallelism moves data only by all-reduces (a
    row-wise projection's output in forward, rerun by a checkpointed layer's recompute up
    to its last saved tensor; a column-wise one's input gradient in backward)."""
    report = dense_reports[name]
    for rank in range(WORLD_SIZE):
        moved: dict[str, int] = measured[rank]["dense"][name]["collectives"]
        assert set(moved) == {"all_reduce"}, moved
        assert report.traffic["tp"][rank] == moved["all_reduce"], (name, rank)
        assert report.traffic["ep_all_to_all"][rank] == report.traffic["pp_send_recv"][rank] == 0


# ---------------------------------------------------------------------------------------
# pipeline parallelism


def _pipe_report(name: str) -> LintReport:
    schedule, microbatches = PIPELINES[name]
    with torch.device("meta"):
        model = PipeNet()
    shapes = shapes_from_module(model)
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in shapes})
    acts = activations_from_module(model, batch=MICROBATCH, seq_len=PIPE_SEQ)
    return lint(
        table,
        shapes,
        mesh_sizes=Mesh(PIPE),
        fsdp={"dense": "dp_shard"},
        training=Training(units=["layers.*"], optimizer="adamw", activations=acts),
        stages=Stages.balanced("pp", layers=4, pp=2, schedule=schedule, microbatches=microbatches),
    )


@pytest.fixture(scope="module")
def pipe_reports() -> dict[str, LintReport]:
    return {name: _pipe_report(name) for name in PIPELINES}


def _stage(rank: int) -> int:
    return Mesh(PIPE).coordinate(rank)[0]


@pytest.mark.parametrize("name", PIPELINES)
def test_stage_parameters_and_pipeline_sends_are_exact(
    measured: Measured, pipe_reports: dict[str, LintReport], name: str
) -> None:
    """Each rank holds its stage's parameters (FSDP2's padded shards of them) and sends
    each microbatch's hidden state on (the first stage) or its gradient back (the last):
    ``microbatches`` tensors of 2 x 5 x 8 float32 values."""
    report = pipe_reports[name]
    _, microbatches = PIPELINES[name]
    assert report.ok, report.problems
    with torch.device("meta"):
        fqns = list(shapes_from_module(PipeNet()))
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in fqns})
    stage_of = assign_stages(STAGES, table).of
    stage_fqns = [sorted(f for f, s in zip(fqns, stage_of, strict=True) if s == i) for i in (0, 1)]
    for rank in range(WORLD_SIZE):
        got = measured[rank]["pipeline"][name]
        assert got["fqns"] == stage_fqns[_stage(rank)], (name, rank)
        assert got["params"] == report.memory.by_kind["params"][rank], (name, rank)
        assert got["sends"] == microbatches
        assert got["sent"] == report.traffic["pp_send_recv"][rank], (name, rank)
        assert got["sent"] == microbatches * MICROBATCH * PIPE_SEQ * 8 * 4


def _in_flight(schedule: str, microbatches: int, stage: int) -> int:
    """The microbatches a stage runs forward before its first backward, as torch's
    schedules order them: GPipe all of them; 1F1B ``num_stages - stage`` (its
    ``warmup_chunks``), at most all."""
    return microbatches if schedule == "gpipe" else min(microbatches, 2 - stage)


@pytest.mark.parametrize("name", PIPELINES)
def test_activations_held_per_stage_equal_the_microbatches_in_flight(
    measured: Measured, pipe_reports: dict[str, LintReport], name: str
) -> None:
    """The most autograd holds at once for a stage's forwards (the loss outside them, as
    outside the trace) is its units' saved bytes times the microbatches in flight,
    exactly, with one difference the test adds: the
    first stage's token ids of all microbatches are one storage (the schedule cuts the
    batch into views of it), held while any microbatch's embedding is, where the package
    counts one microbatch's ids per microbatch in flight. They differ where fewer
    microbatches are in flight than run (1F1B over 4: 160 bytes)."""
    schedule, microbatches = PIPELINES[name]
    report = pipe_reports[name]
    ids = MICROBATCH * PIPE_SEQ * 8  # int64 token ids of one microbatch
    for rank in range(WORLD_SIZE):
        stage = _stage(rank)
        flight = _in_flight(schedule, microbatches, stage)
        extra = (microbatches - flight) * ids if stage == 0 else 0
        held = measured[rank]["pipeline"][name]["held"]
        assert report.memory.by_kind["activations"][rank] + extra == held, (name, rank)


# ---------------------------------------------------------------------------------------
# expert parallelism


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_expert_all_to_all_equals_torchtitans_exchanges(
    measured: Measured, checkpointing: str
) -> None:
    """Each MoE layer dispatches its token rows (2 x 16 tokens, top-2, 256 wide, in
    bfloat16: 32 KiB) and combines them back, in forward and again in backward: four
    exchanges on every rank, routing balanced; six under full checkpointing, whose
    recompute runs the dispatch and the combine again."""
    if not has_torchtitan():
        pytest.skip("torchtitan is not installed")
    model = titan_moe().to(torch.bfloat16)  # as FSDP2's mixed precision computes it
    acts = activations_from_module(model, batch=BATCH, seq_len=SEQ, checkpointing=checkpointing)
    meshes = {role: Mesh(sizes) for role, sizes in EXPERT_MESHES.items()}
    report = lint(
        table_from_torchtitan(titan_moe(), meshes),
        shapes_from_module(titan_moe()),
        mesh_sizes=meshes,
        fsdp={"dense": "dp_shard", "expert": "efsdp"},
        training=Training(
            units=["layers.*"],
            param_dtype="bfloat16",
            reduce_dtype="float32",
            activations=acts,
        ),
    )
    exchanges = 6 if checkpointing == "full" else 4
    for rank in range(WORLD_SIZE):
        moved: dict[str, int] = measured[rank]["experts"][checkpointing]["collectives"]
        assert set(moved) == {"all_to_all_single"}, moved
        assert report.traffic["ep_all_to_all"][rank] == moved["all_to_all_single"], rank
        assert moved["all_to_all_single"] == 2 * exchanges * BATCH * SEQ * 2 * 256 * 2
