"""torchtitan's own tensor- and expert-parallel sharding, read as the package's ``ShardingPlan``.

torchtitan 0.3 shards a model by configuration, not by a ``parallelize_module`` plan. Its
model config's ``update_from_config`` sets a ``ShardingConfig`` on each sub-config, each
module built from one keeps it (``module._sharding_config``), and
``Module.parallelize(parallel_dims)`` distributes every module's own parameters by the
config's ``state_shardings``: parameter name -> ``SpmdLayout``, a spmd type per logical
mesh axis (``dp``, ``cp``, ``tp`` for the dense parameters; ``dp_replicate``, ``efsdp``,
``ep`` for the routed experts when expert parallelism is on). ``plan_from_torchtitan``
reads the same declarations:

- on ``tp`` and ``ep`` (the axes torchtitan shards parameters over), each spmd type as the
  DTensor placement torchtitan resolves it to: ``S(d)`` ``Shard(d)`` (``d`` counted from 0),
  ``R`` and ``I`` ``Replicate``, ``V`` the dim its ``partition_spec`` names;
- on the data-parallel axes (``dp``, ``dp_replicate``, ``dp_shard``, ``fsdp``, ``efsdp``,
  ``cp``, ``pp``) a parameter is whole (FSDP shards it afterwards): nothing to place;
- an axis the run does not have (``tp`` when ``tp_axis`` is not one of ``mesh_axes``) is
  dropped, as torchtitan drops disabled axes; a parameter left with no axis, like one whose
  module has no sharding config, stays a plain tensor and gets no entry
  (``complete_default(..., plain=True)`` completes it).

The routed experts' weights declared ``S(0)`` on ``ep`` are ``expert_parallel`` (the expert
mesh); with expert parallelism off the same weights are declared on ``tp`` (``S(1)`` for
the input-side projections, ``S(2)`` for the output side), dense parameters.

torchtitan's FSDP (``apply_fsdp_to_decoder``) then shards every parameter on dim 0, except
the routed experts of a block with fewer experts than the ranks FSDP and expert parallelism
split them over, which it shards on dim 1: ``shard_dims_from_torchtitan`` gives those dims
for ``compose_table``/``lint``.

Activation checkpointing wraps each block (``layers.0._checkpoint_wrapped_module.…``); FQNs
are given as torch's state dict shows them, without the wrapper's segment. The package never
imports torchtitan: everything is read off the model object.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Final

from torch import nn

from layout_algebra._args import as_items, mapping_items
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Placement, Replicate, Shard, format_placement
from layout_algebra.plan import ShardingPlan, param_fqn
from layout_algebra.torch_bridge._checks import check_module, read_attr
from layout_algebra.torch_bridge._plans import Problems, shard_dim, sharding_plan
from layout_algebra.torch_bridge._walk import (
    named_modules,
    named_parameters,
    own_parameters,
    state_dict_fqn,
)

__all__ = ["plan_from_torchtitan", "shard_dims_from_torchtitan", "state_dict_fqn"]

_TP: Final = "tp"
_EP: Final = "ep"
_DATA_AXES: Final = frozenset({"dp", "dp_replicate", "dp_shard", "fsdp", "efsdp", "cp", "pp"})
"""torchtitan's data-parallel axes: FSDP (or pipelining) owns them, a parameter is whole."""

_R: Final = Replicate()

_PLAN: Final = "plan_from_torchtitan"
_DIMS: Final = "shard_dims_from_torchtitan"
_MISSING: Final = object()
_PARALLEL_DIMS: Final = (
    "pass torchtitan's ParallelDims for the run "
    "(ParallelDims.from_config(job_config.parallelism, world_size))"
)


def _attr(
    obj: object,
    name: str,
    shown: str,
    caller: str,
    *,
    fqn: str | None = None,
    default: object = None,
    remedy: str = "",
) -> object:
    """``obj.name`` (``default`` when it has none), read once (``read_attr``): what it
    raises names ``shown``."""
    remedy = remedy or f"fix {shown}, or build the model from torchtitan's own config"
    return read_attr(obj, name, shown, remedy=remedy, caller=caller, default=default, fqn=fqn)


def _axis_name(axis: object) -> str | None:
    """A torchtitan mesh axis key (``MeshAxisName.TP``, a ``str`` enum) as its name."""
    value = axis.value if isinstance(axis, enum.Enum) else axis
    return value if isinstance(value, str) else None


def _spec_dims(spec: object, axis: str) -> list[int] | None:
    """The tensor dims a ``partition_spec`` shards over ``axis``; ``None``: not a spec."""
    if spec is None:
        return []
    if not isinstance(spec, tuple | list):
        return None
    dims: list[int] = []
    for dim, entry in enumerate(spec):
        names = entry if isinstance(entry, tuple | list) else (entry,)
        if any(_axis_name(name) == axis for name in names if name is not None):
            dims.append(dim)
    return dims


def _placement(value: object, axis: str, spec: object, fqn: str, ndim: int) -> Placement | str:
    """The DTensor placement torchtitan resolves a spmd type to, or why there is none.

    ``S(d)`` is ``Shard(d)``; ``R`` (replicated) and ``I`` (invariant) are ``Replicate``;
    ``V`` (varying) shards the dim the layout's ``partition_spec`` names for ``axis``.

    Raises:
        LayoutError: reading the spmd type's ``dim`` raised, naming ``fqn`` and ``axis``.
    """
    if isinstance(value, enum.Enum):
        return _local_placement(value.name, axis, spec)
    dim = _attr(value, "dim", f"the dim of {fqn}'s spmd type on {axis!r}", _PLAN, fqn=fqn)
    if type(dim) is not int:
        return f"is {quote(value)}, not a spmd type (R, I, V, P or S(dim))"
    normal = shard_dim(dim, ndim)
    if normal is None:
        return f"shards dim {dim} of a parameter with {ndim} dim(s), which it does not have"
    return Shard(normal)


def _local_placement(name: str, axis: str, spec: object) -> Placement | str:
    """``_placement`` of one of spmd_types' local types, by its name."""
    if name in ("R", "I"):
        return _R
    if name == "P":
        return "is P (partial sums), which no parameter can be"
    if name != "V":
        return f"is {clip(name)!r}, not a spmd type (R, I, V, P or S(dim))"
    dims = _spec_dims(spec, axis)
    if dims is None:
        return f"is V with a partition_spec that is not a sequence ({quote(spec)})"
    if len(dims) != 1:
        where = "no dim" if not dims else f"dims {dims}"
        return f"is V, and its partition_spec names {where} for {axis!r}"
    return Shard(dims[0])


def _active(
    axis: AxisLike | None, axes: tuple[AxisName, ...], mesh: object, arg: str
) -> str | None:
    """``axis``'s name when the run has it: one of ``axes``, of more than one rank when
    ``mesh`` (the ``mesh_axes`` given) is a ``Mesh`` (torchtitan drops an axis of one)."""
    if axis is None:
        return None
    try:
        name = as_axis(axis).name
    except LayoutError as e:
        msg = f"plan_from_torchtitan({arg}=...): {e.message}; give an axis name, or None"
        raise LayoutError(msg) from None
    if name not in {a.name for a in axes}:
        return None
    return None if isinstance(mesh, Mesh) and mesh[name] == 1 else name


class _Reader:
    """Each parameter's placements as torchtitan's ``Module.parallelize`` gives them."""

    def __init__(self, tp: str | None, ep: str | None, problems: Problems) -> None:
        self.axes = {_TP: tp, _EP: ep}
        self.problems = problems
        self.placements: dict[str, dict[str, Placement]] = {}
        self.expert: set[str] = set()
        self.declares = {_TP: False, _EP: False}  # an axis some parameter is declared on

    def module(self, path: str, module: nn.Module, config: object) -> None:
        """Read one module's ``ShardingConfig`` for its own parameters."""
        where = f"module {quote(path)}" if path else "the root module"
        shown = f"the state_shardings of {where}'s sharding config"
        raw = _attr(config, "state_shardings", shown, _PLAN, fqn=path)
        if not isinstance(raw, Mapping):
            msg = (
                f"{where}: its sharding config's state_shardings is {quote(raw)}, not a dict "
                "of parameter name -> SpmdLayout; fix the model's ShardingConfig"
            )
            self.problems.add(msg, fqn=path)
            return
        layouts = dict(mapping_items(raw, f"{where}'s state_shardings", "{'weight': ...}"))
        for leaf, param in own_parameters(module, path):
            fqn = param_fqn(path, leaf)
            layout = layouts.get(leaf)
            if layout is None:
                msg = (
                    f"{fqn}: its module's sharding config declares no layout for {quote(leaf)} "
                    "(torchtitan's parallelize raises); add it to the module's "
                    "ShardingConfig.state_shardings"
                )
                self.problems.add(msg, fqn=fqn)
                continue
            self.param(fqn, param.ndim, layout)

    def param(self, fqn: str, ndim: int, layout: object) -> None:
        """Read one parameter's ``SpmdLayout``."""
        types = _attr(layout, "axis_types", f"the axis_types of {fqn}'s layout", _PLAN, fqn=fqn)
        if not isinstance(types, Mapping):
            msg = (
                f"{fqn}: its layout {quote(layout)} has no axis_types mapping mesh axes to "
                "spmd types; declare it as torchtitan's SpmdLayout"
            )
            self.problems.add(msg, fqn=fqn)
            return
        spec = _attr(
            layout, "partition_spec", f"the partition_spec of {fqn}'s layout", _PLAN, fqn=fqn
        )
        named: dict[str, Placement] = {}
        for key, value in mapping_items(types, f"{fqn}'s axis_types", "{TP: spmd.S(0)}"):
            axis = _axis_name(key)
            if axis is None or (axis not in self.axes and axis not in _DATA_AXES):
                msg = (
                    f"{fqn}: its layout names mesh axis {quote(key)}, which is none of "
                    f"torchtitan's ({', '.join(sorted({_TP, _EP, *_DATA_AXES}))}); fix "
                    "the module's ShardingConfig"
                )
                self.problems.add(msg, fqn=fqn)
                continue
            p = _placement(value, axis, spec, fqn, ndim)
            if isinstance(p, str):
                msg = f"{fqn}: its layout on torchtitan's {axis!r} axis {p}; fix its ShardingConfig"
                self.problems.add(msg, fqn=fqn)
                continue
            if axis in _DATA_AXES:
                if p != _R:
                    msg = (
                        f"{fqn}: its layout shards it {format_placement(p)} on torchtitan's "
                        f"data-parallel axis {axis!r}, which FSDP owns (a parameter is whole "
                        "there until FSDP shards it); declare R on it"
                    )
                    self.problems.add(msg, fqn=fqn, placement=format_placement(p))
                continue
            self.declares[axis] = True
            on = self.axes[axis]
            if on is None:
                if axis == _EP and isinstance(p, Shard):
                    msg = (
                        f"{fqn}: its layout shards it {format_placement(p)} on torchtitan's "
                        "'ep' axis (the model's config was updated for a run with expert "
                        "parallelism), but ep_axis is not one of mesh_axes; add the expert "
                        "mesh's axes to mesh_axes, or update the config for this run"
                    )
                    self.problems.add(msg, fqn=fqn, placement=format_placement(p))
                continue  # the run has no such axis: torchtitan drops it
            named[on] = p
            if axis == _EP and isinstance(p, Shard):
                self.expert.add(fqn.rpartition(".")[0])
        if named:
            self.placements[fqn] = named


def _configs(root: nn.Module) -> list[tuple[str, nn.Module, object]]:
    """Every module (FQN as the state dict shows it) with its torchtitan sharding config.

    Raises:
        LayoutError: no module is a torchtitan one, or none carries a config, or reading
            a module's ``_sharding_config`` raised (naming the module).
    """
    found: list[tuple[str, nn.Module, object]] = []
    torchtitan = False
    for path, module in named_modules(root):
        shown = (
            f"the _sharding_config of module {quote(path)}" if path else "model._sharding_config"
        )
        config = _attr(module, "_sharding_config", shown, _PLAN, fqn=path, default=_MISSING)
        if config is _MISSING:
            continue
        torchtitan = True
        if config is not None:
            found.append((state_dict_fqn(path), module, config))
    if not torchtitan:
        msg = (
            f"plan_from_torchtitan(model=...): a {type(root).__qualname__} has no module "
            "carrying a torchtitan ShardingConfig, so it is not a torchtitan model; use "
            "plan_from_parallelize for a parallelize_module plan, or write the ShardingPlan"
        )
        raise LayoutError(msg)
    if not found:
        msg = (
            "plan_from_torchtitan(model=...): no module of the model has a sharding config: "
            "torchtitan sets them when the model's config is updated for the run "
            "(model_config.update_from_config(config=job_config), before build()); build "
            "the model from the updated config"
        )
        raise LayoutError(msg)
    return found


def _tied(root: nn.Module) -> list[tuple[str, str]]:
    """The FQN pairs that name one parameter once torchtitan has set the model up.

    Those sharing one parameter in ``root``, and, when the model ties its embedding to its
    output head (``enable_weight_tying``), that pair: parallelizing registers a parameter
    per module, and torchtitan's ``init_weights`` ties them again.
    """
    holders: dict[nn.Parameter, list[str]] = {}  # parameters hash by identity
    for name, param in named_parameters(root):
        holders.setdefault(param, []).append(name)
    tied = [(group[0], other) for group in holders.values() for other in group[1:]]
    if _attr(root, "enable_weight_tying", "model.enable_weight_tying", _PLAN) is True:
        pair = ("tok_embeddings.weight", "lm_head.weight")  # in the model's order
        names = {n for group in holders.values() for n in group}
        if all(n in names for n in pair) and not any(set(t) == set(pair) for t in tied):
            tied.append(pair)
    return tied


def plan_from_torchtitan(
    model: nn.Module,
    *,
    mesh_axes: Iterable[AxisLike] | Mesh,
    tp_axis: AxisLike | None = "tp",
    ep_axis: AxisLike | None = "ep",
) -> ShardingPlan:
    """The ``ShardingPlan`` giving each parameter what torchtitan's parallelize gives it.

    ``model`` is a torchtitan model built from a config updated for the run
    (``update_from_config``, or the model's own ``set_*_sharding_config``), on any device;
    it is only read, before or after torchtitan's parallelize function ran, with the same
    answer. Its tensor-parallel declarations are read when ``tp_axis`` is one of
    ``mesh_axes``, its expert-parallel ones when ``ep_axis`` is (``None`` reads none; in a
    ``Mesh``, an axis of size 1 is read as absent, as torchtitan leaves a degree of 1 out).
    torchtitan's placements are the same under its three backends (``spmd_types``,
    ``full_dtensor``, ``partial_dtensor``).

    Args:
        model: the torchtitan model (``Decoder``: llama3, qwen3, deepseek_v3, gpt_oss, ...).
        mesh_axes: the run's axis names (the dense and the expert mesh's), or a ``Mesh``.
        tp_axis: the name of torchtitan's ``tp`` axis in ``mesh_axes``, or ``None``.
        ep_axis: the name of torchtitan's ``ep`` axis in ``mesh_axes``, or ``None``.

    Returns:
        One ``{axis: placement}`` per parameter torchtitan distributes over ``tp_axis`` or
        ``ep_axis``, in the model's parameter order (FQNs as its state dict shows them);
        the routed experts' modules ``expert_parallel`` when they shard over ``ep_axis``;
        ``tied_pairs`` for the parameters the trained model shares.

    Raises:
        LayoutError: ``model`` is not a torchtitan model or carries no sharding config,
            or an argument is of the wrong form, or reading the model raised (a module's
            ``_sharding_config``, its ``state_shardings``, a layout's ``axis_types`` or
            ``partition_spec``, a spmd type's ``dim``, the model's walk): naming what was
            read and the module or parameter, the model's exception the ``__cause__``.
        PlanError: every problem at once, each naming the parameter: a parameter its
            module's config declares no layout for (torchtitan raises), a layout torchtitan
            cannot give a parameter (``P``, a shard dim it lacks, a shard on a data-parallel
            axis), expert parallelism declared but ``ep_axis`` not among ``mesh_axes``, or
            ``ep_axis`` among them while no parameter is declared on it.
    """
    root = check_module(model, "plan_from_torchtitan(model=...)")
    arg = "plan_from_torchtitan(mesh_axes=...)"
    axes = as_axes(as_items(mesh_axes, arg, "('fsdp', 'tp')"), arg)
    tp = _active(tp_axis, axes, mesh_axes, "tp_axis")
    ep = _active(ep_axis, axes, mesh_axes, "ep_axis")
    configs = _configs(root)
    problems = Problems("plan_from_torchtitan")
    reader = _Reader(tp, ep, problems)
    for path, module, config in configs:
        reader.module(path, module, config)
    if ep is not None and not reader.declares[_EP]:
        msg = (
            f"ep_axis={ep!r} is one of mesh_axes, but no parameter of the model is declared "
            "on torchtitan's 'ep' axis: its config was updated for a run without expert "
            "parallelism (torchtitan then shards the experts over 'tp'); update the config "
            "with this run's expert_parallel_degree, or pass ep_axis=None"
        )
        problems.add(msg)
    problems.raise_any()
    # modules walked as named_parameters walks them: the placements are in parameter order
    return sharding_plan(
        reader.placements, expert=reader.expert, mesh_axes=axes, tied_pairs=_tied(root)
    )


def _size(parallel_dims: object, name: str, caller: str = _DIMS, arg: str = "parallel_dims") -> int:
    value = _attr(parallel_dims, name, f"{arg}.{name}", caller, remedy=_PARALLEL_DIMS)
    if type(value) is not int or value < 1:
        msg = (
            f"{caller}({arg}=...): its {name!r} is {quote(value)}, not a degree >= 1; "
            f"{_PARALLEL_DIMS}"
        )
        raise LayoutError(msg)
    return value


def _backend(parallel_dims: object, caller: str, arg: str = "parallel_dims") -> object:
    """The run's ``spmd_backend`` (torchtitan's default when the object has none)."""
    return _attr(
        parallel_dims,
        "spmd_backend",
        f"{arg}.spmd_backend",
        caller,
        default="spmd_types",
        remedy=_PARALLEL_DIMS,
    )


def meshes_from_parallel_dims(
    parallel_dims: object, *, caller: str = "table_from_torchtitan", arg: str = "meshes"
) -> dict[str, Mesh]:
    """The meshes torchtitan builds for ``parallel_dims``, by role, as ``Mesh`` values
    (``table_from_torchtitan``'s reading of a ``ParallelDims``).

    The dense mesh is named as the backend names it (``partial_dtensor``: ``pp``,
    ``dp_replicate``, ``fsdp`` (``dp_shard * cp``), ``tp``; ``full_dtensor``: ``pp``,
    ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; ``spmd_types``: ``pp``, ``dp``
    (``dp_replicate * dp_shard``), ``cp``, ``tp``); with expert parallelism the expert mesh
    is ``pp``, ``dp_replicate``, ``efsdp`` (``dp_shard * cp * tp / ep``), ``ep``. tp=2,
    ep=4 on 8 ranks under ``full_dtensor``: dense ``dp_shard=4,tp=2``, expert ``efsdp=2,ep=4``
    (besides axes of size 1).

    Raises:
        LayoutError: ``parallel_dims`` lacks a degree, or reading it raised (naming it),
            or ``ep`` does not divide ``dp_shard * cp * tp`` (torchtitan refuses it).
    """
    if isinstance(parallel_dims, str | bytes | int | float | type(None)):
        msg = (
            f"{caller}({arg}=...) must be torchtitan's ParallelDims or {{role: Mesh}}, got "
            f"{quote(parallel_dims)}"
        )
        raise LayoutError(msg)
    pp, replicate, shard, cp, tp, ep = (
        _size(parallel_dims, n, caller, arg)
        for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
    )
    backend = _backend(parallel_dims, caller, arg)
    data: list[tuple[str, int]]
    if backend == "partial_dtensor":
        data = [("dp_replicate", replicate), ("fsdp", shard * cp)]
    elif backend == "full_dtensor":
        data = [("dp_replicate", replicate), ("dp_shard", shard), ("cp", cp)]
    else:
        data = [("dp", replicate * shard), ("cp", cp)]
    meshes = {"dense": Mesh([("pp", pp), *data, ("tp", tp)])}
    if ep > 1:
        if (shard * cp * tp) % ep:
            msg = (
                f"{caller}({arg}=...): ep={ep} does not divide dp_shard * cp * tp = "
                f"{shard * cp * tp}, the ranks torchtitan's expert mesh takes ep from; "
                f"{_PARALLEL_DIMS}"
            )
            raise LayoutError(msg)
        efsdp = shard * cp * tp // ep
        meshes["expert"] = Mesh(
            [("pp", pp), ("dp_replicate", replicate), ("efsdp", efsdp), ("ep", ep)]
        )
    return meshes


def shard_dims_from_torchtitan(model: nn.Module, *, parallel_dims: object) -> dict[str, int]:
    """The dim torchtitan's FSDP shards each routed expert weight on: 1 or 0.

    ``apply_fsdp_to_decoder`` shards a block's routed experts on dim 1 (their per-expert
    rows) when the block has fewer experts than the ranks it splits them over, else on dim
    0 like every other parameter. Those ranks are ``efsdp`` times ``ep`` with expert
    parallelism (``dp_shard * cp * tp``); without it, the ranks of the mesh handed to
    ``fully_shard``: ``dp_replicate * dp_shard * cp`` under ``partial_dtensor``, and
    ``tp`` too under ``full_dtensor`` and ``spmd_types``. 8 experts over 16 ranks: dim 1.

    Args:
        model: the torchtitan model, as for ``plan_from_torchtitan``.
        parallel_dims: torchtitan's ``ParallelDims`` for the run (its degrees
            ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, ``ep`` and ``spmd_backend``).

    Returns:
        The routed experts' parameter FQNs (as the state dict shows them) with their shard
        dim, for ``compose_table``/``lint``'s ``shard_dim`` (FQNs not named take 0).

    Raises:
        LayoutError: ``model`` is not a module, or ``parallel_dims`` lacks a degree, or
            an MoE block's experts number fewer than one, or reading ``parallel_dims`` or
            a block's ``moe_enabled``, ``moe.routed_experts.inner_experts`` or
            ``num_experts`` raised (naming it and the block, the exception the
            ``__cause__``).
    """
    root = check_module(model, "shard_dims_from_torchtitan(model=...)")
    replicate, shard, cp, tp, ep = (
        _size(parallel_dims, n) for n in ("dp_replicate", "dp_shard", "cp", "tp", "ep")
    )
    backend = _backend(parallel_dims, _DIMS)
    if ep > 1:
        ranks = shard * cp * tp
    elif backend == "partial_dtensor":
        ranks = replicate * shard * cp
    else:
        ranks = replicate * shard * cp * tp
    dims: dict[str, int] = {}
    for path, module in named_modules(root):
        where = f"block {clip(path)!r}" if path else "the model"
        if _attr(module, "moe_enabled", f"the moe_enabled of {where}", _DIMS, fqn=path) is not True:
            continue
        experts: object = module
        for name in ("moe", "routed_experts", "inner_experts"):
            experts = _attr(experts, name, f"the {name} of {where}'s MoE", _DIMS, fqn=path)
        count = _attr(
            experts, "num_experts", f"the num_experts of {where}'s experts", _DIMS, fqn=path
        )
        if not isinstance(experts, nn.Module) or type(count) is not int:
            msg = (
                f"{_DIMS}: {where} is an MoE block (moe_enabled) without "
                "moe.routed_experts.inner_experts.num_experts, which torchtitan's FSDP reads; "
                "is the model a torchtitan decoder?"
            )
            raise LayoutError(msg, fqn=path)
        if count < 1:  # torchtitan's own dim-1 rule would read 0 experts as fewer than the ranks
            msg = (
                f"{_DIMS}: {where}'s experts have num_experts={count}, but an MoE block holds "
                "at least one expert; fix the block's MoE config (num_experts)"
            )
            raise LayoutError(msg, fqn=path)
        dim = 1 if ranks > count else 0
        prefix = param_fqn(path, "moe.routed_experts.inner_experts")
        for leaf, _ in named_parameters(experts):
            dims[state_dict_fqn(param_fqn(prefix, leaf))] = dim
    return dims
