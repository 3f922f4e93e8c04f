"""``bind`` on a 100,000-parameter module against listing its parameters, in one process.

Prints one line: the best-of-several time of ``bind`` and of a bare
``dict(module.named_parameters(remove_duplicate=False))``, and their ratio (target
<= 2.0: binding costs about one more pass over the parameters). The table lists the
parameters in the module's order, as tables built from the model do; the time for the
same table in shuffled order (every FQN looked up by hash) is shown beside it, and so is
``bind`` filling a read-only map over ``torch.utils.weak.WeakIdKeyDictionary`` instead
of ``ParamBindings`` (the alternative weighed in ``param_map``). The module
lives on the meta device, so its values take no memory; the mesh comes from a fake
8-rank process group started in this process. Each timing collects garbage first and
runs with the collector off, as the other benchmarks do. Run alone with
``python -m tests.bench.bench_bind``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.weak import WeakIdKeyDictionary

from layout_algebra import ParamLayoutTable, Replicate, Shard, SourceLayout
from layout_algebra.layout import ParamLayoutTable as Table
from layout_algebra.torch_bridge import Binding, bind
from layout_algebra.torch_bridge.binding import _Binder, _bound, _gc_paused
from layout_algebra.torch_bridge.param_map import _Slot
from tests.bench.bench_build import timed, verdict

__all__ = ["main"]

RATIO_TARGET: Final = 2.0
MODULES: Final = 50_000
"""Tiny linear layers of two parameters each: 100,000 parameters."""
REPEATS: Final = 5


class WeakIdBindings(Mapping[nn.Parameter, Binding]):
    """A read-only ``Mapping`` over torch's ``WeakIdKeyDictionary``: the alternative map.

    Each entry is ``(fqn, slot)``; the ``Binding`` is made on access, as ``ParamBindings``
    makes it.
    """

    def __init__(
        self, entries: Iterable[tuple[str, nn.Parameter, _Slot]], conflict: Callable[[str], None]
    ) -> None:
        self._data: WeakIdKeyDictionary = WeakIdKeyDictionary()
        data = self._data
        for fqn, param, slot in entries:
            first = data.get(param)  # type: ignore[no-untyped-call]  # torch.utils.weak is untyped
            if first is None:
                data[param] = (fqn, slot)
            elif first[1] is not slot:
                conflict(fqn)

    def __getitem__(self, param: nn.Parameter) -> Binding:
        fqn, slot = self._data[param]
        return Binding(fqn, slot.mesh, slot.placements)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self._data.keys())  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self._data)


def bind_weakid(table: Table, module: nn.Module, meshes: Mapping[str, DeviceMesh]) -> object:
    """``bind`` with the same checks and loop, filling a ``WeakIdBindings``."""

    def conflict(fqn: str) -> None:
        msg = f"{fqn}: conflicting aliases"
        raise ValueError(msg)

    with _gc_paused():
        return WeakIdBindings(_bound(table, module, _Binder(meshes)), conflict)


def main() -> None:
    """Measure ``bind`` against ``dict(named_parameters)`` and print the one-line report."""
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp_shard", "tp"))
    with torch.device("meta"):
        module = nn.ModuleList(nn.Linear(4, 4) for _ in range(MODULES))
    column = SourceLayout("dense", ("tp",), (Shard(0),))
    replicate = SourceLayout("dense", ("tp",), (Replicate(),))
    names = [name for name, _ in module.named_parameters(remove_duplicate=False)]
    table = ParamLayoutTable({n: column if n.endswith("weight") else replicate for n in names})
    random.Random(0).shuffle(names)
    shuffled = ParamLayoutTable({n: table[n] for n in names})
    meshes = {"dense": mesh}
    assert len(bind(table, module, meshes)) == len(bind(shuffled, module, meshes)) == len(table)

    weakid = bind_weakid(table, module, meshes)
    assert isinstance(weakid, WeakIdBindings)
    assert len(weakid) == len(table)
    first = next(iter(bind(table, module, meshes).items()))
    assert weakid[first[0]] == first[1]

    best = dict.fromkeys(("named", "bind", "shuffled", "weakid"), float("inf"))
    for _ in range(REPEATS):  # interleaved, so every side sees the same machine
        best["named"] = min(
            best["named"], timed(lambda: dict(module.named_parameters(remove_duplicate=False)))
        )
        best["bind"] = min(best["bind"], timed(lambda: bind(table, module, meshes)))
        best["shuffled"] = min(best["shuffled"], timed(lambda: bind(shuffled, module, meshes)))
        best["weakid"] = min(best["weakid"], timed(lambda: bind_weakid(table, module, meshes)))
    ratio = best["bind"] / best["named"]
    print(
        f"bind {len(table):,} parameters: {best['bind'] * 1e3:.0f} ms vs "
        f"dict(named_parameters) {best['named'] * 1e3:.0f} ms, ratio {ratio:.2f} "
        f"(target <= {RATIO_TARGET}) {verdict(ratio, RATIO_TARGET)}; shuffled table "
        f"{best['shuffled'] * 1e3:.0f} ms, ratio {best['shuffled'] / best['named']:.2f}; "
        f"over WeakIdKeyDictionary {best['weakid'] * 1e3:.0f} ms, "
        f"ratio {best['weakid'] / best['named']:.2f}"
    )


if __name__ == "__main__":
    main()
