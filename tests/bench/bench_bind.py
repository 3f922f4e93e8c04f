"""``bind`` on a 100,000-parameter module against listing its parameters, in one process.

Prints one line: the best-of-several time of ``bind`` and of a bare
``dict(module.named_parameters(remove_duplicate=False))``, and their ratio (target
<= 2.0: binding costs about one more pass over the parameters). The table lists the
parameters in the module's order, as tables built from the model do; the time for the
same table in shuffled order (every FQN looked up by hash) is shown beside it. The module
lives on the meta device, so its values take no memory; the mesh comes from a fake
8-rank process group started in this process. Each timing collects garbage first and
runs with the collector off, as the other benchmarks do. Run alone with
``python -m tests.bench.bench_bind``.
"""

from __future__ import annotations

import random
from typing import Final

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from layout_algebra import ParamLayoutTable, Replicate, Shard, SourceLayout
from layout_algebra.torch_bridge import bind
from tests.bench.bench_build import timed, verdict

__all__ = ["main"]

RATIO_TARGET: Final = 2.0
MODULES: Final = 50_000
"""Tiny linear layers of two parameters each: 100,000 parameters."""
REPEATS: Final = 5


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

    best = dict.fromkeys(("named", "bind", "shuffled"), float("inf"))
    for _ in range(REPEATS):  # interleaved, so every side sees the same machine
        best["named"] = min(
            best["named"], timed(lambda: dict(module.named_parameters(remove_duplicate=False)))
        )
        best["bind"] = min(best["bind"], timed(lambda: bind(table, module, meshes)))
        best["shuffled"] = min(best["shuffled"], timed(lambda: bind(shuffled, module, meshes)))
    ratio = best["bind"] / best["named"]
    print(
        f"bind {len(table):,} parameters: {best['bind'] * 1e3:.0f} ms vs "
        f"dict(named_parameters) {best['named'] * 1e3:.0f} ms, ratio {ratio:.2f} "
        f"(target <= {RATIO_TARGET}) {verdict(ratio, RATIO_TARGET)}; shuffled table "
        f"{best['shuffled'] * 1e3:.0f} ms, ratio {best['shuffled'] / best['named']:.2f}"
    )


if __name__ == "__main__":
    main()
