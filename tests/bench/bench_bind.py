"""``bind`` on a module of 1e5 (and 1e6) parameters against listing them, in one process.

Prints one line per scale (1e5 and 1e6 parameters): the best-of-several time of ``bind``
and of a bare ``dict(module.named_parameters(remove_duplicate=False))``, and their ratio
(target <= 1.3 at 1e5: binding costs about one more pass over the parameters). The table
lists the parameters in the module's order, as tables built from the model do; the same
table in shuffled order (every FQN looked up by hash; target <= 1.5) is timed beside it,
and so is the same walk, lookups and checks over the shuffled table filling a read-only
map over ``torch.utils.weak.WeakIdKeyDictionary`` instead of ``ParamBindings`` (the
alternative weighed in ``param_map``). The module
lives on the meta device, so its values take no memory; the mesh comes from a fake
8-rank process group started in this process. Each timing collects garbage first and
runs with the collector off, as the other benchmarks do. Run alone with
``python -m tests.bench.bench_bind [--quick]``.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.weak import WeakIdKeyDictionary

from layout_algebra import (
    ModulePlan,
    ParamLayoutTable,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    build_table,
)
from layout_algebra.layout import ByModule
from layout_algebra.layout import ParamLayoutTable as Table
from layout_algebra.torch_bridge import Binding, bind
from layout_algebra.torch_bridge._walk import named_parameters, parameter_groups
from layout_algebra.torch_bridge.binding import _Binder, _gc_paused
from tests.bench import alone
from tests.bench.bench_build import timed, verdict
from tests.bench.targets import record

__all__ = ["Scale", "main", "measure", "run"]

RATIO_TARGET: Final = 1.3
SHUFFLED_TARGET: Final = 1.5
GROWTH_TARGET: Final = 1.1
SCALES: Final = (50_000, 500_000)
"""Tiny linear layers of two parameters each: 100,000 and 1,000,000 parameters."""
QUICK_MODULES: Final = (5_000, 50_000)
REPEATS: Final = 5


def _ignore(_: object) -> None:
    """A weak reference's callback that does nothing (``ParamBindings`` gives one)."""


class WeakIdBindings(Mapping[nn.Parameter, Binding]):
    """A read-only ``Mapping`` over torch's ``WeakIdKeyDictionary``: the alternative map.

    Each entry is ``(fqn, slot)``; the ``Binding`` is made on access, as ``ParamBindings``
    makes it.
    """

    def __init__(self) -> None:
        self._data: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __getitem__(self, param: nn.Parameter) -> Binding:
        fqn, slot = self._data[param]
        return Binding(fqn, slot.mesh, slot.placements)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self._data.keys())  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self._data)


def bind_weakid(table: Table, module: nn.Module, meshes: Mapping[str, DeviceMesh]) -> object:
    """``bind``'s walk, lookups and checks, filling a ``WeakIdBindings`` instead."""
    binder = _Binder(meshes)
    out = WeakIdBindings()
    data, by_fqn = out._data, table._items
    with _gc_paused():
        for _, prefix, group in parameter_groups(module):
            for name, param in group:
                if param is None:
                    continue
                fqn = prefix + name
                layout = by_fqn.get(fqn)
                if layout is None:
                    continue
                slot = binder.slot(fqn, layout)
                if slot.min_ndim and param.dim() < slot.min_ndim:
                    raise binder.dim_error(fqn, layout, param)
                first = data.get(param)  # type: ignore[no-untyped-call]  # torch.utils.weak is untyped
                if first is None:
                    data[param] = (fqn, slot)
                elif first[1] is not slot:
                    msg = f"{fqn}: conflicting aliases"
                    raise ValueError(msg)
    return out


@attrs.frozen
class Scale:
    """Best times in seconds at one scale: listing, binding, shuffled, over WeakIdKeyDict."""

    params: int
    named: float
    bind: float
    shuffled: float
    weakid: float
    floor: float
    shuffled_floor: float
    by_module: float
    by_module_reversed: float


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
    # The same table as a plan of the layers builds it: kept by module, in the module's
    # order and in the reverse one.
    kind = ModulePlan({"weight": {"tp": Shard(0)}, "bias": {"tp": Replicate()}})
    order = [str(i) for i in range(modules)]
    by_module, by_module_reversed = (
        build_table(ShardingPlan(dict.fromkeys(keys, kind), mesh_axes=["tp"]), ["tp"])
        for keys in (order, order[::-1])
    )
    assert type(by_module._items) is ByModule and type(by_module_reversed._items) is ByModule
    assert by_module == by_module_reversed == table
    meshes = {"dense": mesh}
    assert dict(bind(by_module, module, meshes)) == dict(bind(table, module, meshes))
    assert len(bind(table, module, meshes)) == len(bind(shuffled, module, meshes)) == len(table)

    weakid = bind_weakid(shuffled, module, meshes)
    assert isinstance(weakid, WeakIdBindings)
    assert len(weakid) == len(table)
    first = next(iter(bind(shuffled, module, meshes).items()))
    assert weakid[first[0]] == first[1]
    del weakid, first

    def floor() -> list[weakref.ref[nn.Parameter]]:
        # what any map held weakly costs: the walk and one weak reference per parameter
        return [weakref.ref(p, _ignore) for _, p in named_parameters(module)]

    def shuffled_floor() -> list[weakref.ref[nn.Parameter]]:
        # and a lookup of each walked FQN in the shuffled table, as any bind must make
        find = shuffled._items.get
        return [
            weakref.ref(p, _ignore) for fqn, p in named_parameters(module) if find(fqn) is not None
        ]

    best = dict.fromkeys(
        (
            "named",
            "bind",
            "shuffled",
            "weakid",
            "floor",
            "shuffled_floor",
            "by_module",
            "by_module_reversed",
        ),
        float("inf"),
    )
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        best["named"] = min(
            best["named"], timed(lambda: dict(module.named_parameters(remove_duplicate=False)))
        )
        best["bind"] = min(best["bind"], timed(lambda: bind(table, module, meshes)))
        best["shuffled"] = min(best["shuffled"], timed(lambda: bind(shuffled, module, meshes)))
        best["weakid"] = min(best["weakid"], timed(lambda: bind_weakid(shuffled, module, meshes)))
        best["floor"] = min(best["floor"], timed(floor))
        best["shuffled_floor"] = min(best["shuffled_floor"], timed(shuffled_floor))
        best["by_module"] = min(best["by_module"], timed(lambda: bind(by_module, module, meshes)))
        best["by_module_reversed"] = min(
            best["by_module_reversed"], timed(lambda: bind(by_module_reversed, module, meshes))
        )
    return Scale(len(table), **best)


def run(*, quick: bool = False) -> None:
    """Measure both scales and print the report (its targets go to ``targets.RESULTS``)."""
    small_n, large_n = QUICK_MODULES if quick else SCALES
    small = measure(small_n)
    large = measure(large_n, repeats=3)
    ratio = small.bind / small.named
    shuffled = small.shuffled / small.named
    floor = f"floor {small.floor / small.named:.2f} (the walk, a weak reference each)"
    record(f"bind / dict(named_parameters), {small.params:,} params", ratio, RATIO_TARGET, floor)
    record(
        f"the same, table shuffled, {small.params:,} params",
        shuffled,
        SHUFFLED_TARGET,
        f"floor {small.shuffled_floor / small.named:.2f} (and a lookup of each FQN)",
    )
    # Most tables are built from a plan of module plans, and kept by module: the same
    # targets, in the module's order and in the reverse one.
    record(
        f"bind of a table kept by module, {small.params:,} params",
        small.by_module / small.named,
        RATIO_TARGET,
        "built from a plan of the layers, in module order",
    )
    record(
        f"the same, modules in reverse order, {small.params:,} params",
        small.by_module_reversed / small.named,
        SHUFFLED_TARGET,
        "an order unlike the module's",
    )

    def growth(a: float, b: float) -> float:
        return (b / large.params) / (a / small.params)

    mine = growth(small.bind, large.bind)
    record(
        "per-entry growth, bind",
        mine,
        GROWTH_TARGET,
        f"dict(named_parameters)'s own {growth(small.named, large.named):.2f}",
    )
    record(
        "per-entry growth, bind of a shuffled table",
        growth(small.shuffled, large.shuffled),
        GROWTH_TARGET,
        f"dict(named_parameters)'s own {growth(small.named, large.named):.2f}",
    )
    for s in (small, large):
        print(
            f"bind {s.params:,} parameters: {s.bind * 1e3:.0f} ms vs "
            f"dict(named_parameters) {s.named * 1e3:.0f} ms, ratio {s.bind / s.named:.2f} "
            f"(target <= {RATIO_TARGET}) {verdict(s.bind / s.named, RATIO_TARGET)}; shuffled "
            f"table {s.shuffled * 1e3:.0f} ms, ratio {s.shuffled / s.named:.2f} (target <= "
            f"{SHUFFLED_TARGET}) {verdict(s.shuffled / s.named, SHUFFLED_TARGET)}; over "
            f"WeakIdKeyDictionary (shuffled) {s.weakid * 1e3:.0f} ms, ratio "
            f"{s.weakid / s.named:.2f}; "
            f"floor (the walk and a weak reference each) {s.floor / s.named:.2f}, shuffled "
            f"(and a lookup of each FQN) {s.shuffled_floor / s.named:.2f}"
        )
        print(
            f"  the table kept by module (built from a plan of the layers): in module order "
            f"{s.by_module * 1e3:.0f} ms, ratio {s.by_module / s.named:.2f}; in reverse "
            f"order {s.by_module_reversed * 1e3:.0f} ms, ratio "
            f"{s.by_module_reversed / s.named:.2f}"
        )
    print(
        f"  per-entry growth {small.params:,} -> {large.params:,}: bind {mine:.2f}, shuffled "
        f"{growth(small.shuffled, large.shuffled):.2f}, dict(named_parameters) "
        f"{growth(small.named, large.named):.2f} (target <= {GROWTH_TARGET})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_bind", __doc__, run, argv, smaller="smaller modules")


if __name__ == "__main__":
    main()
