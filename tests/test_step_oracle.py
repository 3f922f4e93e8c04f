"""The step oracle (``tests/step_oracle.py``) checked, then the package's report against it.

One spawn of 8 gloo ranks runs every case of ``step_oracle.CASES`` once for the module.
First the harness itself: its readings agree with each other and with torch's own
``FSDPMemTracker`` on every rank, and the trivial case (every dim a multiple of the FSDP
world) gives what needs no arithmetic of FSDP's. Then, per case and per rank,
``lint(..., training=...)`` against the measurement: ``memory.by_kind`` ``"params"``,
``"grads"``, ``"optimizer"`` and ``"transient"``, and every ``traffic`` row.

The package's side is written as ``shared/API.md`` spells the setup: ``FSDPUnit`` for a
grouped call, an ``int`` or per-unit ``reshard_after_forward``, ``Optimizer`` for the one
optimizer the package names not (centered RMSprop with momentum), and
``Training(frozen=..., root_reshard_after_forward=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import pytest
import torch

from layout_algebra import FSDPUnit, LintReport, Optimizer, Training, lint
from layout_algebra.serialization import from_json, shapes_from_json
from tests.step_oracle import CASES, WORLD_SIZE, Case, Net, Unit, run_cases

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def measured() -> list[dict[str, dict[str, Any]]]:
    """Every case on every rank: one spawn for the whole module."""
    return run_cases()


def _per_rank(measured: list[dict[str, dict[str, Any]]], name: str) -> list[dict[str, Any]]:
    return [rank[name]["measured"] for rank in measured]


# ---------------------------------------------------------------------------------------
# the harness


@pytest.mark.parametrize("name", CASES)
def test_readings_agree_with_fsdp_and_its_memory_tracker(
    measured: list[dict[str, dict[str, Any]]], name: str
) -> None:
    """Two readings of each quantity, one ours and one torch's, on every rank: FSDP2's
    padded size and its storage; what ``FSDPMemTracker`` holds after the step; the largest
    flat all-gather output and unsharded parameters each of us saw."""
    for rank, m in enumerate(_per_rank(measured, name)):
        tracker = m["tracker"]
        after, largest = tracker["after"], tracker["largest"]
        got = {
            "params": (m["params"], m["params_padded_size"], after["Sharded Param"]),
            "grads": (m["grads"], after["Sharded Grad"]),
            "optimizer": (m["optimizer"], after["OptState"]),
            "all-gather buffers": (m["buffers_largest"]["all_gather"], largest["All Gather"]),
            "unsharded": (m["buffers_largest"]["unsharded"], largest["Unsharded Param"]),
        }
        assert all(len(set(v)) == 1 for v in got.values()), (name, rank, got)
        assert m["optimizer"] == m["optimizer_states"] + m["optimizer_scalars"]
        # padding only adds: each rank allocates at least what it shows
        assert m["params"] >= m["params_local"] and m["grads"] >= m["grads_local"]
        assert m["buffers_peak"] == sum(m["buffers_at_peak"].values())
        assert m["largest_all_gather"] <= m["buffers_largest"]["all_gather"]


def test_the_trivial_case_as_known_without_fsdps_arithmetic(
    measured: list[dict[str, dict[str, Any]]],
) -> None:
    """Every dim 0 of the trivial model is a multiple of 8, so each of the 8 ranks keeps an
    eighth of every parameter, padded by nothing. AdamW keeps two states shaped as the
    shard and a float32 ``step`` per parameter. The root gathers once (torch keeps it
    through the step), each layer twice (freed after forward); each unit reduce-scatters
    once; there is no replicate axis, so nothing is all-reduced."""
    case = CASES["trivial"]
    with torch.device("meta"):
        model = Net(case)
    assert all(p.shape[0] % WORLD_SIZE == 0 for p in model.parameters())
    layer = sum(p.numel() for p in model.layers[0].parameters()) * 4
    total = sum(p.numel() for p in model.parameters()) * 4
    root = total - case.layers * layer
    count = len(list(model.parameters()))
    expected = {
        "params": total // WORLD_SIZE,
        "params_local": total // WORLD_SIZE,
        "grads": total // WORLD_SIZE,
        "optimizer_states": 2 * total // WORLD_SIZE,
        "optimizer_scalars": 4 * count,
        "optimizer_state_names": ["exp_avg", "exp_avg_sq", "step"],
        "all_gather": root + 2 * case.layers * layer,
        "all_gather_calls": 1 + 2 * case.layers,
        "reduce_scatter": total,
        "reduce_scatter_calls": 1 + case.layers,
        "all_reduce": 0,
        "largest_all_gather": max(root, layer),
    }
    for m in _per_rank(measured, "trivial"):
        assert {k: m[k] for k in expected} == expected


def test_what_each_setup_changes_is_seen(measured: list[dict[str, dict[str, Any]]]) -> None:
    """Each case differs from the trivial one where its setup says it must."""

    def at(name: str, key: str, rank: int = 0) -> Any:
        return measured[rank][name]["measured"][key]

    # frozen parameters have no gradient and no optimizer state
    assert at("frozen halves", "grads") < at("frozen halves", "params")
    # 50 rows over 8 ranks: storage padded to 7 rows everywhere, shown rows differ
    last = WORLD_SIZE - 1
    uneven = "uneven: vocab 50 over 8"
    assert at(uneven, "params_local", last) < at(uneven, "params", last) == at(uneven, "params")
    # HSDP all-reduces over its replicate axis; plain FSDP does not
    assert at("hsdp x tp", "all_reduce") > 0 == at("trivial", "all_reduce")
    # not resharded after forward: no unit gathers again in backward
    assert at("no reshard after forward", "all_gather_calls") == 1 + 3
    # the root resharded after forward is gathered again in backward
    assert at("root resharded", "all_gather_calls") == at("trivial", "all_gather_calls") + 1
    # norm and head, one call kept through the step: gathered once, as a unit of its own
    grouped = "norm and head in one unit"
    assert at(grouped, "all_gather_calls") == at("trivial", "all_gather_calls") + 1
    # resharded to 2 ranks after forward: FSDP2 keeps those shards until backward
    shards = {
        n: at(n, "buffers_largest")["post_forward"]
        for n in ("trivial", "reshard after forward to 2 ranks")
    }
    assert shards["trivial"] == 0 < shards["reshard after forward to 2 ranks"]
    # optimizers differ by their state names, as torch defines them
    names = {n: at(f"optimizer {n}", "optimizer_state_names") for n in ("adagrad", "nadam")}
    assert names == {
        "adagrad": ["step", "sum"],
        "nadam": ["exp_avg", "exp_avg_sq", "mu_product", "step"],
    }


# ---------------------------------------------------------------------------------------
# the package against it


def _one_rule(case: Case) -> bool:
    """Whether every unit is one module pattern resharded alike (a bool): plain patterns
    then, the rule ``Training(reshard_after_forward=...)``."""
    rules = {unit.reshard for unit in case.units}
    return not any(u.grouped for u in case.units) and len(rules) <= 1 and rules <= {True, False}


def _unit(unit: Unit) -> FSDPUnit:
    assert unit.reshard is not None, "None is the root's rule"
    modules = unit.modules if unit.grouped else unit.modules[0]
    return FSDPUnit(modules, reshard_after_forward=unit.reshard)


def training_of(case: Case) -> Training:
    """The case's setup as the package spells it (``shared/API.md``)."""
    kwargs: dict[str, Any] = {
        "param_dtype": case.param_dtype,
        "reduce_dtype": case.reduce_dtype,
        "frozen": case.frozen,
        "root_reshard_after_forward": case.root_reshard,
        "optimizer": case.optimizer,
    }
    if _one_rule(case):
        kwargs["units"] = [u.modules[0] for u in case.units]
        kwargs["reshard_after_forward"] = case.units[0].reshard if case.units else True
    else:
        kwargs["units"] = [_unit(u) for u in case.units]
    if case.optimizer == "rmsprop-centered-momentum":  # no name: three states and a step
        kwargs["optimizer"] = Optimizer(states=3, scalars=1)
    return Training(**kwargs)


def report_of(case: Case, rank0: Mapping[str, Any]) -> LintReport:
    """The package's report for ``case``, from the table and shapes rank 0 read."""
    sizes: dict[str, dict[str, int]] = {"dense": case.sizes}
    fsdp: dict[str, str | tuple[str, str]] = {"dense": case.fsdp}
    if case.expert_mesh:
        sizes["expert"] = dict(case.expert_mesh)
        fsdp["expert"] = "efsdp"
    return lint(
        from_json(rank0["table"]),
        shapes_from_json(rank0["shapes"]),
        mesh_sizes=sizes,
        fsdp=fsdp,
        training=training_of(case),
    )


_STATE: Final = ("params", "grads", "optimizer")
_TRAFFIC: Final = ("all_gather", "reduce_scatter", "all_reduce")


@pytest.mark.parametrize("name", CASES)
def test_state_and_traffic_equal_torch_on_every_rank(
    measured: list[dict[str, dict[str, Any]]], name: str
) -> None:
    report = report_of(CASES[name], measured[0][name])
    predicted = [
        {
            **{k: report.memory.by_kind[k][r] for k in _STATE},
            **{k: report.traffic[k][r] for k in _TRAFFIC},
        }
        for r in range(WORLD_SIZE)
    ]
    got = [{k: m[k] for k in (*_STATE, *_TRAFFIC)} for m in _per_rank(measured, name)]
    wrong = [(r, g, p) for r, (g, p) in enumerate(zip(got, predicted, strict=True)) if g != p]
    assert not wrong, "\n".join(f"rank {r}: torch {g}, package {p}" for r, g, p in wrong)


@pytest.mark.parametrize("name", CASES)
def test_transient_equals_fsdp2s_buffers_at_their_peak(
    measured: list[dict[str, dict[str, Any]]], name: str
) -> None:
    report = report_of(CASES[name], measured[0][name])
    got = [m["buffers_peak"] for m in _per_rank(measured, name)]
    assert list(report.memory.by_kind["transient"]) == got
