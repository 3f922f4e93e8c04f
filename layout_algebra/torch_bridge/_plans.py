"""The shared end of the plan importers: parameter placements by FQN into a ``ShardingPlan``.

``plan_from_parallelize`` (torch's ``parallelize_module`` plans) and ``plan_from_hf``
(transformers' ``tp_plan``/``ep_plan``) each work out, parameter by parameter, what the
library does to it; this module turns that into the package's own plan and reports every
problem found on the way in one ``PlanError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import plan_error
from layout_algebra.placements import Placement
from layout_algebra.plan import ModulePlan, ShardingPlan

__all__ = ["Problems", "axis_in", "shard_dim", "sharding_plan"]


class Problems:
    """The problems found while reading one foreign plan, raised together at the end."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.found: list[LayoutError] = []

    def add(self, message: str, *, fqn: str | None = None, placement: str | None = None) -> None:
        """Record one problem (``fqn`` is the module or parameter it concerns)."""
        self.found.append(LayoutError(message, fqn=fqn, placement=placement))

    def raise_any(self) -> None:
        """Raise one ``PlanError`` holding every problem recorded, if there is any."""
        if not self.found:
            return
        raise plan_error(self.what, self.found)


def axis_in(axis: AxisLike, axes: tuple[AxisName, ...], arg: str) -> AxisName:
    """``axis`` checked to be one of ``mesh_axes``; ``arg`` names the argument."""
    try:
        name = as_axis(axis)
    except LayoutError as e:
        msg = f"{arg}: {e.message}"
        raise LayoutError(msg) from None
    if name not in axes:
        msg = (
            f"{arg}: {name.name!r} is not one of mesh_axes {[a.name for a in axes]}; add it to "
            "mesh_axes or name the axis this run's plan shards over"
        )
        raise LayoutError(msg, axis=name.name)
    return name


def shard_dim(dim: int, ndim: int) -> int | None:
    """``dim`` counted from 0 on a tensor of ``ndim`` dims (``-1`` is the last), or ``None``.

    As torch reads a ``Shard(dim)``: on a 3-D expert weight ``-1`` is dim 2, on a 1-D bias
    ``-1`` is dim 0. A dim the tensor does not have gives ``None``.
    """
    normal = dim + ndim if dim < 0 else dim
    return normal if 0 <= normal < ndim else None


def sharding_plan(
    placements: Mapping[str, Mapping[str, Placement]],
    *,
    expert: Iterable[str] = (),
    mesh_axes: Iterable[AxisLike],
    tied_pairs: Iterable[tuple[str, str]] = (),
) -> ShardingPlan:
    """The ``ShardingPlan`` giving each parameter FQN its named placements.

    Each parameter is planned in the module that owns it (its FQN up to the last dot);
    the modules named in ``expert`` are ``expert_parallel``. Modules and parameters keep
    the order of ``placements``.
    """
    experts = set(expert)
    grouped: dict[str, dict[str, Mapping[str, Placement]]] = {}
    for fqn, named in placements.items():
        owner, _, leaf = fqn.rpartition(".")
        grouped.setdefault(owner, {})[leaf] = named
    modules = {
        owner: ModulePlan(params, expert_parallel=owner in experts)
        for owner, params in grouped.items()
    }
    return ShardingPlan(modules, mesh_axes=as_axes(mesh_axes, "mesh_axes"), tied_pairs=tied_pairs)
