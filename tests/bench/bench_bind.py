"""``bind`` on modules of 1e4, 1e5 and 1e6 parameters against listing them, in one process.

At each scale: the best-of-several time of ``bind`` and of a bare
``dict(module.named_parameters(remove_duplicate=False))``, interleaved so both see the same
machine. Targets: ``bind`` at most 2.0x the listing at 1e5 parameters, and its per-entry
cost from 1e4 to 1e6 growing no faster than the listing's own. The table lists the
parameters in the module's order, as tables built from the model do; the same table in
shuffled order is timed beside it, and so is what any weakly held map made through
torch's own walk pays (the walk and one weak reference per parameter). The module lives
on the meta device, so its values take no memory; the mesh comes from a fake 8-rank
process group started in this process. Each timing collects garbage first and runs with
the collector off, as the other benchmarks do.

Then one model as users build it: a ``ModuleList`` of 25,000 modules of four parameters
(4x4, 4x4, 4 and 4x4: 1e5 parameters, on the meta device), bound to the fake ``(2, 4)``
mesh against ``dict(model.named_parameters())``, the call a user makes, with its table in
the model's order and shuffled. These calls are timed with the collector on, as a
program runs them: each side called several times in a row, so the collections the
objects it keeps set off fall among its own calls, and the figure is the best of a few
rounds of the mean per call. A full collection walks everything the process holds, so
the block model is timed in a process of its own, as a program that builds its model and
binds it. Targets: ``bind`` at most 2.0x the listing timed so, in either order. The same
calls are timed with the collector off as well (target: the model's order no slower
than shuffled), and so is torch's walk with a weak reference each. The collections are
counted: what ``bind`` keeps per parameter (its weak reference) is what any weakly held
map keeps, so it sets off no more young collections than that map does (target: at most
1.1x). Run alone with ``python -m tests.bench.bench_bind [--quick]``.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from layout_algebra import ParamLayoutTable, Replicate, Shard, SourceLayout
from layout_algebra.torch_bridge import bind
from tests.bench import alone
from tests.bench.bench_build import timed, verdict
from tests.bench.targets import record

__all__ = ["Blocks", "Scale", "main", "measure", "measure_blocks", "run"]

RATIO_TARGET: Final = 2.0
SCALES: Final = (5_000, 50_000, 500_000)
"""Tiny linear layers of two parameters each: 1e4, 1e5 and 1e6 parameters."""
QUICK_SCALES: Final = (500, 5_000, 50_000)
REPEATS: Final = 5
BLOCKS: Final = 25_000
"""Modules of four parameters each in one ``ModuleList``: 1e5 parameters."""
QUICK_BLOCKS: Final = 2_500
YOUNG_TARGET: Final = 1.1
"""Young collections per ``bind`` over a weakly held map's: one kept object per parameter."""
CALLS_IN_A_ROW: Final = 6
"""Calls per side with the collector on: enough for the full collections that the objects
kept by a few calls set off to fall among them."""
ROUNDS_ON: Final = 3
"""Rounds of ``CALLS_IN_A_ROW`` calls per side with the collector on; the best is kept."""


def _ignore(_: object) -> None:
    """A weak reference's callback that does nothing (``ParamBindings`` gives one)."""


@attrs.frozen
class Scale:
    """Best times in seconds at one scale: listing, binding, binding shuffled, and a weakly
    held map through torch's walk."""

    params: int
    named: float
    bind: float
    shuffled: float
    weak_map: float


def _fake_mesh() -> DeviceMesh:
    """The ``(2, 4)`` mesh ``("dp_shard", "tp")`` of a fake 8-rank process group."""
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    return init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp_shard", "tp"))


def measure(modules: int, repeats: int = REPEATS) -> Scale:
    """Every side on ``modules`` tiny linear layers (two parameters each)."""
    mesh = _fake_mesh()
    with torch.device("meta"):
        module = nn.ModuleList(nn.Linear(4, 4) for _ in range(modules))
    column = SourceLayout("dense", ("tp",), (Shard(0),))
    replicate = SourceLayout("dense", ("tp",), (Replicate(),))
    names = [name for name, _ in module.named_parameters(remove_duplicate=False)]
    table = ParamLayoutTable({n: column if n.endswith("weight") else replicate for n in names})
    random.Random(0).shuffle(names)
    shuffled = ParamLayoutTable({n: table[n] for n in names})
    del names
    meshes = {"dense": mesh}
    assert dict(bind(table, module, meshes)) == dict(bind(shuffled, module, meshes))
    assert len(bind(table, module, meshes)) == len(table)

    def weak_map() -> list[weakref.ref[nn.Parameter]]:
        # what any map held weakly through torch's walk costs: a weak reference each
        walk = module.named_parameters(remove_duplicate=False)
        return [weakref.ref(p, _ignore) for _, p in walk]

    best = dict.fromkeys(("named", "bind", "shuffled", "weak_map"), float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        best["named"] = min(
            best["named"], timed(lambda: dict(module.named_parameters(remove_duplicate=False)))
        )
        best["bind"] = min(best["bind"], timed(lambda: bind(table, module, meshes)))
        best["shuffled"] = min(best["shuffled"], timed(lambda: bind(shuffled, module, meshes)))
        best["weak_map"] = min(best["weak_map"], timed(weak_map))
    return Scale(len(table), **best)


class _Block(nn.Module):
    """Four parameters: two 4x4 weights, a 4-vector and another 4x4 weight."""

    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Parameter(torch.empty(4, 4))
        self.wk = nn.Parameter(torch.empty(4, 4))
        self.norm = nn.Parameter(torch.empty(4))
        self.wo = nn.Parameter(torch.empty(4, 4))


@attrs.frozen
class Blocks:
    """The block model's figures: best times in seconds with the collector off, the best
    mean seconds per call with it on (``*_on``), and young and full collections per call."""

    params: int
    named: float
    named_all: float
    bind: float
    shuffled: float
    weak_map: float
    named_on: float
    bind_on: float
    shuffled_on: float
    weak_map_on: float
    bind_collections: tuple[float, float]
    weak_map_collections: tuple[float, float]


def _in_a_row(fn: Callable[[], object], calls: int) -> tuple[float, tuple[float, float]]:
    """Mean seconds per call of ``calls`` calls of ``fn`` in a row with the collector on,
    and the young and full collections per call they set off (from a collected heap)."""
    gc.collect()
    before = [generation["collections"] for generation in gc.get_stats()]
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    after = [generation["collections"] for generation in gc.get_stats()]
    return elapsed / calls, ((after[0] - before[0]) / calls, (after[-1] - before[-1]) / calls)


def measure_blocks(blocks: int, repeats: int = REPEATS) -> Blocks:
    """Every side on a ``ModuleList`` of ``blocks`` modules of four parameters."""
    mesh = _fake_mesh()
    with torch.device("meta"):
        model = nn.ModuleList(_Block() for _ in range(blocks))
    column = SourceLayout("dense", ("tp",), (Shard(0),))
    row = SourceLayout("dense", ("tp",), (Shard(1),))
    replicate = SourceLayout("dense", ("tp",), (Replicate(),))
    by_name = {"wq": column, "wk": column, "norm": replicate, "wo": row}
    names = [name for name, _ in model.named_parameters()]
    table = ParamLayoutTable({n: by_name[n.rpartition(".")[2]] for n in names})
    random.Random(0).shuffle(names)
    shuffled = ParamLayoutTable({n: table[n] for n in names})
    del names
    meshes = {"dense": mesh}
    assert dict(bind(table, model, meshes)) == dict(bind(shuffled, model, meshes))
    assert len(bind(table, model, meshes)) == len(table)

    def weak_map() -> list[weakref.ref[nn.Parameter]]:
        walk = model.named_parameters(remove_duplicate=False)
        return [weakref.ref(p, _ignore) for _, p in walk]

    sides: dict[str, Callable[[], object]] = {
        "named": lambda: dict(model.named_parameters()),
        "named_all": lambda: dict(model.named_parameters(remove_duplicate=False)),
        "bind": lambda: bind(table, model, meshes),
        "shuffled": lambda: bind(shuffled, model, meshes),
        "weak_map": weak_map,
    }
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        for side, fn in sides.items():
            best[side] = min(best[side], timed(fn))
    on = dict.fromkeys(("named", "bind", "shuffled", "weak_map"), float("inf"))
    collections: dict[str, tuple[float, float]] = {}
    for _ in range(ROUNDS_ON):  # interleaved too
        for side in on:
            seconds, collections[side] = _in_a_row(sides[side], CALLS_IN_A_ROW)
            on[side] = min(on[side], seconds)
    return Blocks(
        len(table),
        **best,
        named_on=on["named"],
        bind_on=on["bind"],
        shuffled_on=on["shuffled"],
        weak_map_on=on["weak_map"],
        bind_collections=collections["bind"],
        weak_map_collections=collections["weak_map"],
    )


def _report_blocks(b: Blocks) -> None:
    """Record the block model's targets and print its figures."""
    order_on, shuffled_on = b.bind_on / b.named_on, b.shuffled_on / b.named_on
    order, shuffled = b.bind / b.named, b.shuffled / b.named
    model = f"{b.params:,} params in blocks of four"
    weak_map_on = (
        f"collector on; torch's walk and a weak reference each {b.weak_map_on / b.named_on:.2f}"
    )
    record(f"bind / dict(named_parameters()), {model}", order_on, RATIO_TARGET, weak_map_on)
    record(
        f"bind shuffled / dict(named_parameters()), {model}", shuffled_on, RATIO_TARGET, weak_map_on
    )
    record(f"bind in the model's order / shuffled, {model}", b.bind / b.shuffled, 1.0)
    young = b.bind_collections[0] / b.weak_map_collections[0]
    record(
        f"young collections per bind / a weakly held map's, {model}",
        young,
        YOUNG_TARGET,
        "collector on: what bind keeps per parameter, against one weak reference",
    )
    print(
        f"bind {b.params:,} parameters in {b.params // 4:,} modules of four, collector on "
        f"(best of {ROUNDS_ON} rounds of the mean of {CALLS_IN_A_ROW} calls in a row): "
        f"{b.bind_on * 1e3:.0f} ms vs dict(named_parameters()) {b.named_on * 1e3:.0f} ms, "
        f"ratio {order_on:.2f} (target <= {RATIO_TARGET}) {verdict(order_on, RATIO_TARGET)}; "
        f"shuffled {shuffled_on:.2f} {verdict(shuffled_on, RATIO_TARGET)}; torch's walk and "
        f"a weak reference each {b.weak_map_on / b.named_on:.2f}"
    )
    print(
        f"  collections per call (young, full): bind {b.bind_collections[0]:.0f}, "
        f"{b.bind_collections[1]:.2f}; a weakly held map {b.weak_map_collections[0]:.0f}, "
        f"{b.weak_map_collections[1]:.2f}; young ratio {young:.2f} (target <= {YOUNG_TARGET}) "
        f"{verdict(young, YOUNG_TARGET)}"
    )
    print(
        f"  collector off (best of {REPEATS}): {b.bind * 1e3:.0f} ms vs {b.named * 1e3:.0f} ms, "
        f"ratio {order:.2f} in order, {shuffled:.2f} shuffled, torch's walk and a weak "
        f"reference each {b.weak_map / b.named:.2f}"
    )
    print(
        f"  against named_parameters(remove_duplicate=False), the walk bind takes, collector "
        f"off: {b.bind / b.named_all:.2f} in order, {b.shuffled / b.named_all:.2f} shuffled, "
        f"torch's walk and a weak reference each {b.weak_map / b.named_all:.2f}"
    )


def run(*, quick: bool = False) -> None:
    """Measure every scale and print the report (its targets go to ``targets.RESULTS``)."""
    small_n, middle_n, large_n = QUICK_SCALES if quick else SCALES
    small, middle, large = measure(small_n), measure(middle_n), measure(large_n, repeats=3)
    record(
        f"bind / dict(named_parameters), {middle.params:,} params",
        middle.bind / middle.named,
        RATIO_TARGET,
        f"shuffled table {middle.shuffled / middle.named:.2f}; torch's walk and a weak "
        f"reference each {middle.weak_map / middle.named:.2f}",
    )

    def growth(a: float, b: float) -> float:
        return (b / large.params) / (a / small.params)

    mine, theirs = growth(small.bind, large.bind), growth(small.named, large.named)
    record("per-entry growth, bind", mine, theirs, "target: dict(named_parameters)'s own")
    for s in (small, middle, large):
        print(
            f"bind {s.params:,} parameters: {s.bind * 1e3:.0f} ms vs dict(named_parameters) "
            f"{s.named * 1e3:.0f} ms, ratio {s.bind / s.named:.2f}; shuffled table "
            f"{s.shuffled / s.named:.2f}; torch's walk and a weak reference each "
            f"{s.weak_map / s.named:.2f}"
        )
    print(
        f"  bind at {middle.params:,}: ratio {middle.bind / middle.named:.2f} (target <= "
        f"{RATIO_TARGET}) {verdict(middle.bind / middle.named, RATIO_TARGET)}; per-entry "
        f"growth {small.params:,} -> {large.params:,}: bind {mine:.2f}, "
        f"dict(named_parameters) {theirs:.2f} {verdict(mine, theirs)}"
    )
    _report_blocks(_alone(QUICK_BLOCKS if quick else BLOCKS))


def _alone(blocks: int) -> Blocks:
    """``measure_blocks(blocks)`` in a new process: the collector's full walks cost what
    the whole heap holds, so only the model and what binding it needs are there."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure_blocks, (blocks,))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_bind", __doc__, run, argv, smaller="smaller modules")


if __name__ == "__main__":
    main()
