"""What torch itself does, asked directly: the oracles the tests compare the package with.

Every function here hands a question to torch (``fully_shard``, DTensor's placements and
shard arithmetic, FSDP2's chunking) and reports torch's answer in the package's terms
(``SourceLayout``, shapes, index lists, tensor blocks). None of them computes a layout
itself: where the package and these disagree, the package is wrong.

Meshes come from :class:`MeshFactory` (the ``world_mesh`` fixture of ``conftest.py``), one
per distinct (shape, names) for the whole session, on the fake 8-rank process group.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Placement as TorchPlacement
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Shard as TorchShard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.multiprocessing.spawn import ProcessExitedException, spawn

from layout_algebra import SourceLayout
from layout_algebra.torch_bridge import from_torch, to_torch

__all__ = [
    "MeshFactory",
    "coordinates",
    "dtensor_block",
    "dtensor_indices",
    "dtensor_shape_and_offset",
    "fsdp_block",
    "fsdp_managed",
    "fully_sharded",
    "layout_of",
    "on_fake_ranks",
    "on_gloo",
    "rank_block",
    "rank_coordinates",
]

Shape = tuple[int, ...]
Coordinate = Mapping[str, int]


class MeshFactory:
    """Named CPU meshes over the whole fake world, each built once per session.

    ``init_device_mesh`` creates process groups for every dim, so tests that ask for the
    same (shape, names) share one mesh instead of building another.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._built: dict[tuple[Shape, tuple[str, ...] | None], DeviceMesh] = {}

    def __call__(self, sizes: Mapping[str, int]) -> DeviceMesh:
        """The mesh with these axes, in this order, of these sizes (row-major ranks)."""
        return self._mesh(tuple(sizes.values()), tuple(sizes))

    def unnamed(self, *shape: int) -> DeviceMesh:
        """A mesh of this shape whose dims have no names."""
        return self._mesh(shape, None)

    def _mesh(self, shape: Shape, names: tuple[str, ...] | None) -> DeviceMesh:
        key = (shape, names)
        mesh = self._built.get(key)
        if mesh is None:
            if math.prod(shape) != self.world_size:
                msg = (
                    f"a mesh of shape {shape} holds {math.prod(shape)} ranks, but the "
                    f"world has {self.world_size}; give sizes whose product is {self.world_size}"
                )
                raise ValueError(msg)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            self._built[key] = mesh
        return mesh


def coordinates(axes: Sequence[str], sizes: Mapping[str, int]) -> Iterator[dict[str, int]]:
    """Every rank's coordinate over ``axes``, row-major, as torch numbers a mesh's ranks."""
    for index in itertools.product(*(range(sizes[a]) for a in axes)):
        yield dict(zip(axes, index, strict=True))


def rank_coordinates(sizes: Mapping[str, int]) -> Iterator[dict[str, int]]:
    """Every global rank's coordinate over all of ``sizes``' axes, in rank order."""
    return coordinates(list(sizes), sizes)


def layout_of(param: DTensor, mesh: str = "dense") -> SourceLayout:
    """The layout torch reports for ``param``: its mesh's dim names and its placements."""
    names = param.device_mesh.mesh_dim_names
    assert names is not None, "the DTensor's mesh has no dim names"
    return SourceLayout(mesh, names, [from_torch(p) for p in param.placements])


def fully_sharded(
    world: DeviceMesh,
    source: SourceLayout,
    shape: Sequence[int],
    *,
    shard: str,
    replicate: Sequence[str] = (),
    shard_dim: int = 0,
) -> DTensor:
    """The parameter torch's ``fully_shard`` makes of one of ``shape`` laid out as ``source``.

    The parameter (on the meta device: only metadata matters) is distributed over
    ``source``'s axes of ``world`` first, then wrapped by ``fully_shard`` over
    ``(*replicate, shard)``, sharding ``shard_dim``.

    Raises:
        NotImplementedError: whatever torch refuses (more source axes than FSDP2 composes).
    """
    module = nn.Module()
    full = torch.empty(tuple(shape), device="meta")
    if source.axes:
        axes = tuple(a.name for a in source.axes)
        sub = world[axes[0]] if len(axes) == 1 else world[axes]
        full = distribute_tensor(full, sub, [to_torch(p) for p in source.placements])
    module.w = nn.Parameter(full)
    dp = world[(*replicate, shard)] if replicate else world[shard]
    if shard_dim:
        fully_shard(module, mesh=dp, shard_placement_fn=lambda _: TorchShard(shard_dim))
    else:
        fully_shard(module, mesh=dp)
    w = module.w
    assert isinstance(w, DTensor)
    return w


def _torch_placements(layout: SourceLayout) -> list[TorchPlacement]:
    return [to_torch(p) for p in layout.placements]


def dtensor_shape_and_offset(
    shape: Sequence[int], layout: SourceLayout, sizes: Mapping[str, int], at: Coordinate
) -> tuple[Shape, Shape]:
    """DTensor's own local shape and global offset for the rank at coordinate ``at``.

    ``sizes`` and ``at`` may name more axes than ``layout`` has; only its axes count.
    """
    axes = [a.name for a in layout.axes]
    return _compute_local_shape_and_global_offset(
        tuple(shape),
        tuple(sizes[a] for a in axes),
        [at[a] for a in axes],
        _torch_placements(layout),
    )


def dtensor_indices(
    shape: Sequence[int], layout: SourceLayout, sizes: Mapping[str, int], at: Coordinate
) -> tuple[tuple[int, ...], ...]:
    """Per tensor dim, the global indices torch's placements give the rank at ``at``.

    Each dim's index vector is cut mesh dim by mesh dim with the placement's own
    ``_split_tensor``, as ``distribute_tensor`` cuts the tensor; a placement cuts one
    tensor dim, so the rank's block is the product of these lists.
    """
    ndim = len(shape)
    out: list[tuple[int, ...]] = []
    for dim, n in enumerate(shape):
        view = [1] * dim + [-1] + [1] * (ndim - dim - 1)
        index = torch.arange(n).view(view)
        for axis, p in zip(layout.axes, layout.placements, strict=True):
            split = to_torch(p)
            if isinstance(split, TorchShard | _StridedShard) and split.dim == dim:
                pieces, _ = split._split_tensor(index, sizes[axis.name], with_padding=False)
                index = pieces[at[axis.name]]
        out.append(tuple(int(i) for i in index.reshape(-1)))
    return tuple(out)


def dtensor_block(
    full: torch.Tensor, layout: SourceLayout, sizes: Mapping[str, int], at: Coordinate
) -> torch.Tensor:
    """The block of ``full`` that ``distribute_tensor`` gives the rank at ``at``."""
    block = full
    for dim, index in enumerate(dtensor_indices(full.shape, layout, sizes, at)):
        block = block.index_select(dim, torch.tensor(index, dtype=torch.long))
    return block


def rank_block(full: torch.Tensor, param: DTensor) -> torch.Tensor:
    """The block of ``full`` that ``param``'s placements give this process's rank."""
    mesh = param.device_mesh
    names = mesh.mesh_dim_names
    coordinate = mesh.get_coordinate()
    assert names is not None and coordinate is not None
    sizes = dict(zip(names, mesh.shape, strict=True))
    at = dict(zip(names, coordinate, strict=True))
    return dtensor_block(full, layout_of(param), sizes, at)


def fsdp_block(
    full: torch.Tensor,
    source: SourceLayout,
    sizes: Mapping[str, int],
    at: Coordinate,
    *,
    shard: str,
    shard_dim: int = 0,
) -> torch.Tensor:
    """The block of ``full`` FSDP2 really keeps on the rank at ``at``.

    ``fully_shard`` takes the source DTensor's local block and cuts it with its own
    ``_chunk_with_empty`` over the ``shard`` axis on ``shard_dim`` (a replicate axis cuts
    nothing). In the uneven multi-axis case this differs from DTensor's reading of the
    composed placements. A rank past the last chunk keeps an empty block, shaped as the
    sharded parameter shows it (size 0 on ``shard_dim``).
    """
    local = dtensor_block(full, source, sizes, at)
    chunk = _chunk_with_empty(local, sizes[shard], dim=shard_dim)[at[shard]]
    if chunk.numel() == 0:
        return local.narrow(shard_dim, 0, 0)
    return chunk


def fsdp_managed(module: nn.Module) -> list[nn.Parameter]:
    """The parameters torch's ``fully_shard`` state of ``module`` manages, in its order."""
    state = fully_shard.state(module)  # type: ignore[attr-defined]  # set by torch's contract decorator
    group = state._fsdp_param_group
    assert group is not None
    return [fp.sharded_param for fp in group.fsdp_params]


# ---------------------------------------------------------------------------------------
# every rank of a fake world, one after the other


def on_fake_ranks(scenario: Callable[..., object], *args: object, world_size: int = 8) -> list[Any]:
    """What ``scenario(rank, *args)`` returns on each rank of a fake world, in rank order.

    The fake process group moves no data, but neither ``distribute_tensor(...,
    src_data_rank=None)`` (each rank cuts its own full tensor) nor ``fully_shard``'s
    initialisation (each rank chunks its local tensor) needs to: what a rank keeps is real.
    One child process (the session's own fake world is left alone) plays every rank in
    turn, the fake group created anew as each; ``scenario`` builds its meshes afresh on
    each rank (``MeshFactory(world_size)``), must be a module-level function and returns
    a JSON value.

    Raises:
        torch.multiprocessing.ProcessRaisedException: ``scenario`` raised; its traceback
            is in the message.
    """
    with tempfile.TemporaryDirectory() as out:
        job = _Job(scenario, args, world_size, 0, out)
        _spawn(_fake_ranks, job, nprocs=1)
        values: list[Any] = json.loads(Path(out, "ranks.json").read_text())
    return values


def _fake_ranks(_: int, job: _Job) -> None:
    """The child: every rank of the fake world in turn; the values to a file."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC0415

    values = []
    for rank in range(job.world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=job.world_size)
        try:
            values.append(job.scenario(rank, *job.args))
        finally:
            dist.destroy_process_group()
    Path(job.out, "ranks.json").write_text(json.dumps(values))


def _spawn(fn: Callable[[int, _Job], None], job: _Job, *, nprocs: int) -> None:
    """``fn(i, job)`` in ``nprocs`` fresh processes, which import ``tests.*`` by name."""
    added = _ROOT not in sys.path
    if added:  # the children import the scenario's module from the repository root
        sys.path.insert(0, _ROOT)
    try:
        spawn(fn, args=(job,), nprocs=nprocs, join=True)  # type: ignore[no-untyped-call]  # torch.multiprocessing.spawn is unannotated
    finally:
        if added:
            sys.path.remove(_ROOT)


class _Job(NamedTuple):
    scenario: Callable[..., object]
    args: tuple[object, ...]
    world_size: int
    port: int
    out: str


_ROOT = str(Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------------------
# real ranks: gloo processes on the CPU


def on_gloo(scenario: Callable[..., object], *args: object, world_size: int) -> list[Any]:
    """What ``scenario(rank, *args)`` returns on each of ``world_size`` real gloo ranks.

    Each rank is a process of its own (``torch.multiprocessing.spawn``) in one gloo
    process group over TCP on this host. ``scenario`` must be a module-level function (the
    ranks import its module by name) returning a JSON value; it comes back through JSON.

    Raises:
        AssertionError: a rank raised; the message holds every such rank's traceback.
    """
    with tempfile.TemporaryDirectory() as out:
        files = [Path(out, f"rank{r}.json") for r in range(world_size)]
        try:
            _spawn(
                _gloo_rank, _Job(scenario, args, world_size, _free_port(), out), nprocs=world_size
            )
        except ProcessExitedException:
            # gloo may abort a rank in its teardown; once every rank wrote its result, the
            # run is complete and that abort says nothing of the scenario
            if not all(f.exists() for f in files):
                raise
        results = [json.loads(f.read_text()) for f in files]
    raised = [
        f"rank {r} raised:\n{res['traceback']}" for r, res in enumerate(results) if not res["ok"]
    ]
    assert not raised, "\n".join(raised)
    return [result["value"] for result in results]


def _gloo_rank(rank: int, job: _Job) -> None:
    """One rank: join the group, run the scenario, write its value (or its traceback).

    A rank that succeeded shuts its group down only once every rank has written its
    result: gloo torn down on one rank while a peer is still exchanging with it can abort
    either process. A rank that raised shuts down at once, so that a peer left waiting in a
    collective it never joined fails instead of hanging.
    """
    result: dict[str, object]
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{job.port}", rank=rank, world_size=job.world_size
        )
        result = {"ok": True, "value": job.scenario(rank, *job.args)}
    except BaseException:
        result = {"ok": False, "traceback": traceback.format_exc()}
    try:
        written = Path(job.out, f"rank{rank}.json.part")
        written.write_text(json.dumps(result))
        written.rename(Path(job.out, f"rank{rank}.json"))
        if result["ok"]:
            _await_results(job)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _await_results(job: _Job, *, timeout: float = 120.0) -> None:
    """Wait (at most ``timeout`` seconds) until every rank has written its result."""
    deadline = time.monotonic() + timeout
    files = [Path(job.out, f"rank{r}.json") for r in range(job.world_size)]
    while not all(f.exists() for f in files) and time.monotonic() < deadline:
        time.sleep(0.005)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
