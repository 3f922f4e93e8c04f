"""The whole step without torch's run: activations in the step's timeline, the peak, the
traffic of tensor, expert and pipeline parallelism, and the microbatches a pipeline
stage holds at once (checked against the order torch's own schedules run).

What a real run on gloo ranks keeps and sends is checked in ``test_whole_step_gloo.py``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
from torch.distributed.pipelining.stage import _PipelineStageBase

from layout_algebra import (
    Activations,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    Stages,
    Training,
    lint,
)
from layout_algebra._pipeline import Placed, in_flight, place
from layout_algebra.errors import SerializationError
from layout_algebra.lint import LintReport
from layout_algebra.serialization import converter
from layout_algebra.training import training_from_obj, training_to_obj

COL = SourceLayout("dense", ["tp"], [Shard(0)])
ROW = SourceLayout("dense", ["tp"], [Shard(1)])
PLAIN = SourceLayout("dense", ["tp"], [Replicate()])
FSDP = {"dense": "dp_shard"}
BLOCK: dict[str, int] = {"sequence": 640, "heads": 1280, "experts": 0, "fixed": 16}


def model(layers: int) -> tuple[ParamLayoutTable, dict[str, ParamShape]]:
    """A decoder of ``layers`` blocks: a column-wise and a row-wise projection each."""
    table: dict[str, SourceLayout] = {"tok_embeddings.weight": PLAIN}
    shapes = {"tok_embeddings.weight": ParamShape((32, 8), "float32")}
    for i in range(layers):
        table[f"layers.{i}.up.weight"] = COL
        table[f"layers.{i}.down.weight"] = ROW
        shapes[f"layers.{i}.up.weight"] = ParamShape((16, 8), "float32")
        shapes[f"layers.{i}.down.weight"] = ParamShape((8, 16), "float32")
    table["norm.weight"] = PLAIN
    table["output.weight"] = PLAIN
    shapes["norm.weight"] = ParamShape((8,), "float32")
    shapes["output.weight"] = ParamShape((32, 8), "float32")
    return ParamLayoutTable(table), shapes


def traced(layers: int, *, boundary: int = 256) -> Activations:
    """What a trace of ``model(layers)`` would give: each block its kinds, each
    projection its input and output bytes for one microbatch."""
    units: dict[str, dict[str, int]] = {"": {"sequence": 512}}
    modules: dict[str, tuple[str, int, int]] = {"tok_embeddings": ("embedding", 64, 256)}
    for i in range(layers):
        units[f"layers.{i}"] = BLOCK
        modules[f"layers.{i}.up"] = ("linear", 256, 512)
        modules[f"layers.{i}.down"] = ("linear", 512, 256)
    return Activations(units=units, batch=2, seq_len=4, boundary=boundary, modules=modules)


def run(
    layers: int = 4,
    mesh: Mesh | None = None,
    *,
    activations: Activations | None = None,
    stages: Stages | None = None,
    sequence_parallel: bool = False,
) -> LintReport:
    table, shapes = model(layers)
    training = Training(
        units=["layers.*"], activations=activations, sequence_parallel=sequence_parallel
    )
    sizes = mesh or Mesh({"dp_shard": 2, "tp": 2})
    return lint(table, shapes, mesh_sizes=sizes, fsdp=FSDP, training=training, stages=stages)


# ---------------------------------------------------------------------------------------
# activations and the peak


def test_activations_are_a_ranks_share_and_the_peak_holds_them_all_at_backwards_start() -> None:
    acts = traced(4)
    report = lint(
        *model(4),
        mesh_sizes=Mesh({"dp_shard": 2, "tp": 2}),
        fsdp=FSDP,
        training=Training(units=["layers.*"], activations=acts),
    )
    memory = report.memory
    assert memory.by_kind["activations"] == (acts.held(tp=2),) * 4
    plain = lint(
        *model(4),
        mesh_sizes=Mesh({"dp_shard": 2, "tp": 2}),
        fsdp=FSDP,
        training=Training(units=["layers.*"]),
    )
    assert "activations" not in plain.memory.by_kind
    for r in range(4):
        state = sum(memory.by_kind[k][r] for k in ("params", "optimizer", "master"))
        # at the first unit's backward every unit's activations are held
        assert memory.peak[r] >= state + memory.by_kind["activations"][r]
        assert memory.peak[r] > plain.memory.peak[r]
    written = report.to_dict()["memory"]
    assert isinstance(written, dict) and written["peak"] == list(memory.peak)
    assert "peak" in str(report)


def test_sequence_parallelism_divides_the_residual_stream_by_tp() -> None:
    acts = traced(2)
    mesh = Mesh({"dp_shard": 2, "tp": 4})
    off = run(2, mesh, activations=acts)
    on = run(2, mesh, activations=acts, sequence_parallel=True)
    assert off.memory.by_kind["activations"][0] == acts.held(tp=4)
    assert on.memory.by_kind["activations"][0] == acts.held(tp=4, sequence_parallel=True)
    assert on.memory.peak[0] < off.memory.peak[0]


def test_a_traced_unit_the_run_does_not_have_is_held_through_the_step_and_said() -> None:
    table, shapes = model(2)
    acts = Activations(units={"": {}, "blocks.0": BLOCK}, batch=1, seq_len=4)
    report = lint(
        table,
        shapes,
        mesh_sizes=Mesh({"dp_shard": 2, "tp": 2}),
        fsdp=FSDP,
        training=Training(units=["layers.*"], activations=acts),
    )
    assert any("no unit of this run holds those of 'blocks.0'" in a for a in report.assumptions)
    assert report.memory.by_kind["activations"][0] == acts.held(tp=2)


def test_checkpointing_adds_one_units_recompute_to_the_peak_not_to_what_is_held() -> None:
    held = traced(4)
    redo = attrs_evolve(held, recompute={f"layers.{i}": 4096 for i in range(4)})
    a, b = run(4, activations=held), run(4, activations=redo)
    assert a.memory.by_kind["activations"] == b.memory.by_kind["activations"]
    gap = b.memory.peak[0] - a.memory.peak[0]
    # a rank's share of one unit's recompute: 4096 scaled as the unit's bytes are on it
    whole = sum(BLOCK.values())
    share = held.shares(tp=2)["layers.0"]
    assert 0 < gap <= -(-4096 * share // whole)


def attrs_evolve(acts: Activations, **changes: object) -> Activations:
    return attrs.evolve(acts, **changes)  # type: ignore[arg-type]  # fields by name


# ---------------------------------------------------------------------------------------
# traffic


def test_tp_traffic_follows_each_projections_placement() -> None:
    report = run(3, activations=traced(3))
    # column-wise up: its input's gradient all-reduced (256 B); row-wise down: its
    # output (256 B); the embedding and output are not sharded over tp
    assert report.traffic["tp"] == (3 * (256 + 256),) * 4
    assert report.traffic["ep_all_to_all"] == (0,) * 4
    assert report.traffic["pp_send_recv"] == (0,) * 4
    one = run(3, Mesh({"dp_shard": 4, "tp": 1}), activations=traced(3))
    assert one.traffic["tp"] == (0,) * 4


def test_cp_divides_the_tokens_tp_moves() -> None:
    report = run(2, Mesh({"dp_shard": 2, "cp": 2, "tp": 2}), activations=traced(2))
    assert report.traffic["tp"][0] == 2 * (128 + 128)


def test_ep_traffic_is_four_exchanges_of_the_routed_rows_where_experts_shard_over_ep() -> None:
    table = ParamLayoutTable(
        {
            "layers.0.moe.experts.w1": SourceLayout("expert", ["ep"], [Shard(0)]),
            "layers.0.moe.router.weight": SourceLayout("dense", [], []),
        }
    )
    shapes = {
        "layers.0.moe.experts.w1": ParamShape((4, 8, 8), "float32"),
        "layers.0.moe.router.weight": ParamShape((4, 8), "float32"),
    }
    acts = Activations(
        units={"": {}, "layers.0": BLOCK}, batch=1, seq_len=4, routed={"layers.0.moe.experts": 1000}
    )
    meshes = {"dense": Mesh({"dp_shard": 4}), "expert": Mesh({"dp_shard": 2, "ep": 2})}
    report = lint(
        table,
        shapes,
        mesh_sizes=meshes,
        fsdp={"dense": "dp_shard", "expert": "dp_shard"},
        training=Training(units=["layers.*"], activations=acts),
    )
    assert report.traffic["ep_all_to_all"] == (4000,) * 4


# ---------------------------------------------------------------------------------------
# pipeline stages


def placed(pp: int, stages: int, schedule: str, m: int) -> Placed:
    names = [[f"layers.{i}"] for i in range(stages)]
    given = Stages("pp", names, schedule=schedule, microbatches=m)
    mesh = Mesh({"pp": pp, "dp_shard": 2})
    owned = frozenset({"pp", "dp_shard"})
    return place(given, [f"layers.{i}.w" for i in range(stages)], {"dense": mesh}, owned)


@pytest.mark.parametrize(("pp", "m"), [(2, 1), (2, 4), (4, 2), (4, 8)])
def test_gpipe_holds_every_microbatch_and_1f1b_the_stages_after_it(pp: int, m: int) -> None:
    for s in range(pp):
        assert in_flight(placed(pp, pp, "gpipe", m), s) == m
        # torch's Schedule1F1B: warmup_chunks = min(microbatches, stages - stage_index)
        assert in_flight(placed(pp, pp, "1f1b", m), s) == min(m, pp - s)


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 3, 6)])
def test_interleaved_counts_the_forwards_before_the_ranks_first_backward(
    pp: int, v: int, m: int, fake_world: int
) -> None:
    """Against the order torch's ``ScheduleInterleaved1F1B`` runs on each rank (on a group
    of ``pp`` ranks of the fake world)."""
    group = dist.new_group(list(range(pp)))
    local: list[_PipelineStageBase] = [
        PipelineStage(torch.nn.Linear(2, 2), k * pp, pp * v, torch.device("cpu"), group=group)
        for k in range(v)
    ]
    schedule = ScheduleInterleaved1F1B(local, m, loss_fn=lambda a, _: a.sum())
    order = schedule.pipeline_order
    where = placed(pp, pp * v, "interleaved-1f1b", m)
    for rank, actions in order.items():
        done: dict[int, int] = {}
        for action in actions:
            if action is None:
                continue
            kind = str(action.computation_type)
            if kind not in ("F", "FORWARD") and not kind.endswith("FORWARD"):
                break
            done[action.stage_index] = done.get(action.stage_index, 0) + 1
        for stage in range(rank, pp * v, pp):
            assert in_flight(where, stage) == done.get(stage, 0), (rank, stage)


def test_stages_send_each_microbatchs_hidden_state_on_and_its_gradient_back() -> None:
    acts = traced(4, boundary=256)
    mesh = Mesh({"pp": 2, "dp_shard": 2, "tp": 2})
    stages = Stages(
        "pp",
        [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]],
        microbatches=4,
    )
    report = run(4, mesh, activations=acts, stages=stages)
    sends = report.traffic["pp_send_recv"]
    # stage 0 sends 4 hidden states on, stage 1 4 gradients back: 256 B each
    assert sends == (4 * 256,) * 8
    sp = run(4, mesh, activations=acts, stages=stages, sequence_parallel=True)
    assert sp.traffic["pp_send_recv"] == (4 * 128,) * 8
    acts_of = report.memory.by_kind["activations"]
    share = acts.shares(tp=2)
    # 1F1B with 4 microbatches: stage 0 holds 2 at once, stage 1 (with the root's) 1
    assert acts_of[0] == 2 * (share["layers.0"] + share["layers.1"])
    assert acts_of[4] == share["layers.2"] + share["layers.3"] + share[""]
    assert report.traffic["tp"][0] == 4 * 2 * 512
    assert any("4 microbatches a step" in a for a in report.assumptions)


def test_microbatches_not_given_are_one_per_pipeline_rank_and_said() -> None:
    mesh = Mesh({"pp": 2, "dp_shard": 2, "tp": 2})
    stages = Stages.balanced("pp", layers=4, pp=2, last=("norm", "output"))
    report = run(4, mesh, activations=traced(4), stages=stages)
    said = [a for a in report.assumptions if "microbatches a step" in a]
    assert said and "2 microbatches a step (not given: one per pipeline rank)" in said[0]


# ---------------------------------------------------------------------------------------
# the values


def test_training_with_activations_round_trips_through_json() -> None:
    t = Training(units=["layers.*"], activations=traced(2), sequence_parallel=True)
    obj = training_to_obj(t)
    assert obj["sequence_parallel"] is True
    assert json.loads(json.dumps(obj))["activations"]["modules"]["layers.0.up"] == [
        "linear",
        256,
        512,
    ]
    assert training_from_obj(json.loads(json.dumps(obj))) == t
    assert converter.structure(converter.unstructure(t), Training) == t


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modules": {"a": ("conv", 1, 2)}}, r"modules=\.\.\.\)\['a'\] must be \(kind"),
        ({"modules": {"a": ("linear", -1, 2)}}, r"from 0"),
        ({"modules": ["a"]}, r"must map module FQNs"),
        ({"routed": {"e": "many"}}, r"routed=\.\.\.\)\['e'\]"),
        ({"boundary": 1.5}, r"boundary=\.\.\.\) must be an int"),
    ],
)
def test_bad_traced_flows_are_layout_errors_naming_the_field(
    kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(LayoutError, match=match):
        Activations(units={}, batch=1, seq_len=1, **kwargs)  # type: ignore[arg-type]


def test_bad_training_flags_are_layout_errors() -> None:
    with pytest.raises(LayoutError, match=r"sequence_parallel=\.\.\.\) must be True or False"):
        Training(sequence_parallel=1)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=r"activations=\.\.\.\) must be an Activations"):
        Training(activations={"units": {}})  # type: ignore[arg-type]


def test_a_bad_modules_entry_in_json_is_named_by_its_path() -> None:
    obj: dict[str, Any] = training_to_obj(Training(activations=traced(1)))
    obj = json.loads(json.dumps(obj))
    obj["activations"]["modules"]["layers.0.up"] = ["linear", "x", 1]
    with pytest.raises(SerializationError) as e:
        training_from_obj(obj)
    assert e.value.path == 'activations.modules["layers.0.up"]'
