"""``bind`` on modules of 1e4, 1e5 and 1e6 parameters against listing them, in one process.

At each scale: the best-of-several time of ``bind`` and of a bare
``dict(module.named_parameters(remove_duplicate=False))``, interleaved so both see the same
machine. Targets: ``bind`` at most 2.0x the listing at 1e5 parameters, and its per-entry
cost from 1e4 to 1e6 growing no faster than the listing's own. The table lists the
parameters in the module's order, as tables built from the model do; the same table in
shuffled order is timed beside it, and so is the floor any weakly held map pays (torch's
walk and one weak reference per parameter). The module lives on the meta device, so its
values take no memory; the mesh comes from a fake 8-rank process group started in this
process. Each timing collects garbage first and runs with the collector off, as the
other benchmarks do. Run alone with ``python -m tests.bench.bench_bind [--quick]``.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Sequence
from typing import Final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from layout_algebra import ParamLayoutTable, Replicate, Shard, SourceLayout
from layout_algebra.torch_bridge import bind
from tests.bench import alone
from tests.bench.bench_build import timed, verdict
from tests.bench.targets import record

__all__ = ["Scale", "main", "measure", "run"]

RATIO_TARGET: Final = 2.0
SCALES: Final = (5_000, 50_000, 500_000)
"""Tiny linear layers of two parameters each: 1e4, 1e5 and 1e6 parameters."""
QUICK_SCALES: Final = (500, 5_000, 50_000)
REPEATS: Final = 5


def _ignore(_: object) -> None:
    """A weak reference's callback that does nothing (``ParamBindings`` gives one)."""


@attrs.frozen
class Scale:
    """Best times in seconds at one scale: listing, binding, binding shuffled, the floor."""

    params: int
    named: float
    bind: float
    shuffled: float
    floor: float


def measure(modules: int, repeats: int = REPEATS) -> Scale:
    """Every side on ``modules`` tiny linear layers (two parameters each)."""
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp_shard", "tp"))
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

    def floor() -> list[weakref.ref[nn.Parameter]]:
        # what any map held weakly costs: the walk and one weak reference per parameter
        walk = module.named_parameters(remove_duplicate=False)
        return [weakref.ref(p, _ignore) for _, p in walk]

    best = dict.fromkeys(("named", "bind", "shuffled", "floor"), float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        best["named"] = min(
            best["named"], timed(lambda: dict(module.named_parameters(remove_duplicate=False)))
        )
        best["bind"] = min(best["bind"], timed(lambda: bind(table, module, meshes)))
        best["shuffled"] = min(best["shuffled"], timed(lambda: bind(shuffled, module, meshes)))
        best["floor"] = min(best["floor"], timed(floor))
    return Scale(len(table), **best)


def run(*, quick: bool = False) -> None:
    """Measure every scale and print the report (its targets go to ``targets.RESULTS``)."""
    small_n, middle_n, large_n = QUICK_SCALES if quick else SCALES
    small, middle, large = measure(small_n), measure(middle_n), measure(large_n, repeats=3)
    record(
        f"bind / dict(named_parameters), {middle.params:,} params",
        middle.bind / middle.named,
        RATIO_TARGET,
        f"shuffled table {middle.shuffled / middle.named:.2f}; floor "
        f"{middle.floor / middle.named:.2f} (the walk, a weak reference each)",
    )

    def growth(a: float, b: float) -> float:
        return (b / large.params) / (a / small.params)

    mine, theirs = growth(small.bind, large.bind), growth(small.named, large.named)
    record("per-entry growth, bind", mine, theirs, "target: dict(named_parameters)'s own")
    for s in (small, middle, large):
        print(
            f"bind {s.params:,} parameters: {s.bind * 1e3:.0f} ms vs dict(named_parameters) "
            f"{s.named * 1e3:.0f} ms, ratio {s.bind / s.named:.2f}; shuffled table "
            f"{s.shuffled / s.named:.2f}; floor (the walk and a weak reference each) "
            f"{s.floor / s.named:.2f}"
        )
    print(
        f"  bind at {middle.params:,}: ratio {middle.bind / middle.named:.2f} (target <= "
        f"{RATIO_TARGET}) {verdict(middle.bind / middle.named, RATIO_TARGET)}; per-entry "
        f"growth {small.params:,} -> {large.params:,}: bind {mine:.2f}, "
        f"dict(named_parameters) {theirs:.2f} {verdict(mine, theirs)}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_bind", __doc__, run, argv, smaller="smaller modules")


if __name__ == "__main__":
    main()
