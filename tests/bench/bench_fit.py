"""``fit`` over 16,384 ranks against 100 of the import + lint calls it is made of.

The model is Llama-3-8B-shaped (transformers' own, built from a config object on the meta
device; nothing downloads), its plan ``table_from_hf``'s, trained in bf16 with fp32
reduction under AdamW, 80 GiB a rank. ``fit`` searches every mesh of 16,384 ranks
(thousands of factorizations) for the best ten; the baseline is 100 calls of what it
does per mesh it does not skip, the plan built and linted, on 100 meshes spread evenly
over its enumeration. Both run in this process. The target: the whole search at most the time
of those 100 calls. Twice: the model state alone, and with the activations of 8,192
tokens under full checkpointing (traced once, outside both timings), where each ``cp``
is a lint of its own. ``--quick``: 1,024 ranks. Run alone with ``python -m
tests.bench.bench_fit [--quick]``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Final

import torch
from torch import nn

from layout_algebra import FitReport, Mesh, ParamLayoutTable, Training, fit
from layout_algebra.fit import AXES, _Enumeration, _Model, _Search
from layout_algebra.torch_bridge import (
    activations_from_module,
    shapes_from_module,
    table_from_hf,
    training_from_module,
)
from tests.bench import alone
from tests.bench.bench_build import verdict
from tests.bench.targets import record

__all__ = ["RATIO_TARGET", "main", "run"]

RATIO_TARGET: Final = 1.0
RANKS: Final = 16_384
QUICK_RANKS: Final = 1_024
BUDGET: Final = 80 * 2**30
CALLS: Final = 100


def llama3_8b() -> nn.Module:
    """Llama-3-8B's shapes in bf16 on the meta device."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - slow import

    config = LlamaConfig(
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        dtype="bfloat16",
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _calls(model: nn.Module, training: Training, ranks: int) -> tuple[float, int]:
    """Seconds of ``CALLS`` import + lint calls on meshes ``fit`` would lint, spread evenly
    over its enumeration (every pipeline depth and tensor-parallel size, not the order of
    their bounds), and how many were made."""
    shapes = shapes_from_module(model)

    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        return table_from_hf(model, mesh_axes=meshes["dense"], expert_axes=meshes.get("expert"))

    tied = plan_for({"dense": Mesh({"dp_shard": ranks})}).tied
    found = _Model(shapes, training, tied)
    enumeration = _Enumeration(ranks, frozenset(AXES) - {"ep"}, found, None)
    every = [
        family.group(i)
        for family in enumeration.families(BUDGET)
        for i in range(len(family.members))
    ]
    groups = every[:: max(1, len(every) // CALLS)][:CALLS]  # spread over every pp and tp
    search = _Search(
        shapes,
        training=training,
        plan_for=plan_for,
        budget=BUDGET,
        stages=enumeration.stages,
        terms=found.terms,
    )
    start = time.perf_counter()
    for group in groups:
        search.lint(group)
    return time.perf_counter() - start, len(groups)


def _fit(model: nn.Module, training: Training, ranks: int) -> tuple[float, FitReport]:
    shapes = shapes_from_module(model)

    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        return table_from_hf(model, mesh_axes=meshes["dense"], expert_axes=meshes.get("expert"))

    start = time.perf_counter()
    report = fit(shapes, ranks=ranks, budget=BUDGET, training=training, plan_for=plan_for)
    return time.perf_counter() - start, report


def run(*, quick: bool = False) -> tuple[int, int]:
    """Measure and print the report; how many targets were met, of how many (2)."""
    ranks = QUICK_RANKS if quick else RANKS
    model = llama3_8b()
    plain = training_from_module(model, param_dtype="bfloat16", reduce_dtype="float32")
    acts = activations_from_module(model, batch=1, seq_len=8192, checkpointing="full")
    traced = training_from_module(
        model, param_dtype="bfloat16", reduce_dtype="float32", activations=acts
    )
    met = 0
    print(f"fit, Llama-3-8B-shaped, {ranks:,} ranks of 80 GiB, the best 10")
    for name, training in (("model state", plain), ("with activations", traced)):
        searched, report = _fit(model, training, ranks)
        spent, made = _calls(model, training, ranks)
        per_call = spent / made
        ratio = searched / (per_call * CALLS)
        print(f"  {name}:")
        print(
            f"    fit                       {searched:.3f} s ({report.candidates:,} meshes, "
            f"{report.evaluated} import+lint calls)"
        )
        print(f"    {CALLS} import+lint calls      {per_call * CALLS:.3f} s ({made} timed)")
        print(
            f"    fit / {CALLS} calls             {ratio:.2f}  target <= {RATIO_TARGET:.1f}  "
            f"{verdict(ratio, RATIO_TARGET)}"
        )
        met += ratio <= RATIO_TARGET
        record(
            f"fit / {CALLS} import+lint calls, {name}",
            ratio,
            RATIO_TARGET,
            f"{ranks:,} ranks, {report.evaluated} lints",
        )
    return met, 2


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_fit", __doc__, run, argv, smaller="1,024 ranks")


if __name__ == "__main__":
    main()
