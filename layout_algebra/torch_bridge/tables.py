"""A real model's complete table in one call, from its transformers, torch or torchtitan plan.

Each is the composition of the importer, ``build_table`` and ``complete_default``: the
parameters the plan places, then every other parameter as the plain tensor torch,
transformers and torchtitan leave it, and every tie the library keeps (every alias of a
tied parameter included), so the axes are spelled once and no FQN is listed by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from torch import nn

from layout_algebra._args import as_items
from layout_algebra._text import quote
from layout_algebra.algebra import build_table, complete_default
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import compose_table
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.mesh import Mesh, as_role_sizes
from layout_algebra.plan import ShardingPlan
from layout_algebra.torch_bridge._checks import check_module
from layout_algebra.torch_bridge._walk import named_parameters
from layout_algebra.torch_bridge.parallelize import ParallelizePlan, plan_from_parallelize
from layout_algebra.torch_bridge.torchtitan import meshes_from_parallel_dims, plan_from_torchtitan
from layout_algebra.torch_bridge.transformers import plan_from_hf

__all__ = ["table_from_hf", "table_from_parallelize", "table_from_torchtitan"]

_EXAMPLE = "('fsdp', 'tp')"

_FSDP_AXES: Final = FSDP_OWNED_AXES - {"pp"}
"""The owned axes ``fully_shard`` shards over: all but pipelining's."""


def _axes(value: Iterable[AxisLike] | Mesh, arg: str) -> tuple[str, ...]:
    """Axis names from a list of names or a ``Mesh`` (its names, in order)."""
    return tuple(a.name for a in as_axes(as_items(value, arg, _EXAMPLE), arg))


def _complete(
    model: nn.Module,
    plan: ShardingPlan,
    dense: tuple[str, ...],
    expert: tuple[str, ...] | None,
) -> ParamLayoutTable:
    # The importer knows which ties survive (torch unties a tied weight it distributes).
    names = [name for name, _ in named_parameters(model)]
    table = build_table(plan, dense, expert_axes=expert, fqns=names)
    table = complete_default(table, names, dense, plain=True, tied_pairs=plan.tied_pairs)
    # in module order, as the model runs: the step model follows its units by position
    # (the plan's parameters would otherwise come before the ones it leaves plain)
    return ParamLayoutTable({name: table[name] for name in names}, tied=table.tied)


def _fsdp_axis(mesh: Mesh) -> str | None:
    """FSDP's shard axis on ``mesh``: its last FSDP axis of more than one rank, if any."""
    found = [name for name, size in mesh.axes if name in _FSDP_AXES and size > 1]
    return found[-1] if found else None


def _check_fsdp(table: ParamLayoutTable, meshes: Mapping[str, Mesh]) -> None:
    """Refuse what ``fully_shard`` cannot compose on the roles whose mesh has an FSDP axis.

    FSDP's own axes (which one shards, whether HSDP replicates) never change what it can
    compose with a source layout, so the shard axis alone is given.

    Raises:
        PlanError: every parameter ``compose_table`` refuses, naming it and the limit.
    """
    fsdp = {role: axis for role, mesh in meshes.items() if (axis := _fsdp_axis(mesh))}
    if not fsdp:
        return
    sharded = ParamLayoutTable({fqn: lay for fqn, lay in table.items() if lay.mesh in fsdp})
    compose_table(sharded, fsdp=fsdp, mesh_sizes={role: meshes[role] for role in fsdp})


def table_from_hf(
    model: nn.Module,
    *,
    mesh_axes: Iterable[AxisLike] | Mesh,
    expert_axes: Iterable[AxisLike] | Mesh | None = None,
    tp_axis: AxisLike | None = "tp",
    ep_axis: AxisLike | None = "ep",
) -> ParamLayoutTable:
    """The complete table transformers' own parallelism gives ``model``.

    ``plan_from_hf`` read with the dense mesh's axes ``mesh_axes`` (and the expert mesh's
    ``expert_axes`` for a mixture-of-experts run), built, and completed: parameters no
    rule shards are plain tensors (``dense[]``), tied parameters one group. The expert
    plan is read only when ``ep_axis`` is one of ``expert_axes``. Given ``Mesh`` values,
    the tensor-parallel size is read from the dense mesh, for transformers' unit styles,
    and a mesh with an FSDP axis (one of ``FSDP_OWNED_AXES`` but ``pp``) of more than one
    rank is a run ``fully_shard`` shards: the table is refused where FSDP2 cannot compose
    it (``plan_from_hf(..., fsdp=True)``: a weight a unit style puts on a mesh of
    transformers' own; ``compose_table``: a layout of more than two source axes).

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
    ...     tie_word_embeddings=True)
    >>> with torch.device("meta"):
    ...     model = LlamaForCausalLM(config)
    >>> table = table_from_hf(model, mesh_axes=Mesh({"fsdp": 2, "tp": 4}))
    >>> print(table["model.layers.0.self_attn.o_proj.weight"], table["model.norm.weight"])
    dense[tp=S(1)] dense[]
    >>> [sorted(group) for group in table.tied]
    [['lm_head.weight', 'model.embed_tokens.weight']]

    Raises:
        BindError: ``model`` is not an ``nn.Module``.
        LayoutError: what ``plan_from_hf``, ``build_table`` and ``complete_default``
            raise (a ``PlanError`` holding every problem of the plan), and with an FSDP
            axis of more than one rank what ``compose_table`` raises (a ``PlanError``).
    """
    check_module(model, "table_from_hf(model=...)")
    dense = _axes(mesh_axes, "mesh_axes")
    expert = None if expert_axes is None else _axes(expert_axes, "expert_axes")
    ep = None if ep_axis is None or expert is None else as_axis(ep_axis).name
    if ep is not None and expert is not None and ep not in expert:
        ep = None
    run_axes = dict.fromkeys((*dense, *(expert or ())))
    tp_size = None
    if isinstance(mesh_axes, Mesh) and tp_axis is not None:
        tp_size = mesh_axes.get(as_axis(tp_axis).name)
    meshes = {
        role: mesh
        for role, mesh in (("dense", mesh_axes), ("expert", expert_axes))
        if isinstance(mesh, Mesh)
    }
    # sizes are known only from a Mesh: names alone say nothing of FSDP's degree
    fsdp = "dense" in meshes and _fsdp_axis(meshes["dense"]) is not None
    plan = plan_from_hf(
        model, tp_axis=tp_axis, ep_axis=ep, mesh_axes=run_axes, tp_size=tp_size, fsdp=fsdp
    )
    table = _complete(model, plan, dense, expert)
    _check_fsdp(table, meshes)
    return table


def table_from_parallelize(
    model: nn.Module,
    plan: ParallelizePlan,
    *,
    mesh_axes: Iterable[AxisLike] | Mesh,
    axis: AxisLike = "tp",
) -> ParamLayoutTable:
    """The complete table torch's ``parallelize_module(model, mesh[axis], plan)`` gives.

    ``plan_from_parallelize`` read with ``mesh_axes``, built, and completed: parameters
    no style touches stay plain tensors (``dense[]``), tied parameters one group.

    Raises:
        BindError: ``model`` is not an ``nn.Module``.
        LayoutError: what ``plan_from_parallelize``, ``build_table`` and
            ``complete_default`` raise.
    """
    check_module(model, "table_from_parallelize(model=...)")
    dense = _axes(mesh_axes, "mesh_axes")
    sharding = plan_from_parallelize(model, plan, axis=axis, mesh_axes=dense)
    return _complete(model, sharding, dense, None)


_ROLES: Final = ("dense", "expert")


def _titan_meshes(meshes: object) -> dict[str, Mesh]:
    """``meshes`` as a ``Mesh`` by role: ``{role: Mesh}`` checked, or those torchtitan
    builds for a ``ParallelDims`` (anything that is not a mapping is read as one).

    Raises:
        LayoutError: naming ``meshes``: a role other than ``dense`` and ``expert``, no
            ``dense`` mesh, meshes of different worlds, or a ``ParallelDims`` that lacks
            a degree.
    """
    arg = "table_from_torchtitan(meshes=...)"
    if not isinstance(meshes, Mapping):
        return meshes_from_parallel_dims(meshes, arg="meshes")
    roles = as_role_sizes(meshes, arg)
    unknown = [role for role in roles if role not in _ROLES]
    if unknown or "dense" not in roles:
        what = f"has the role {quote(unknown[0])}" if unknown else "has no 'dense' mesh"
        msg = (
            f"{arg} {what}: torchtitan lays a run out on a 'dense' mesh and, with expert "
            "parallelism, an 'expert' one; give {'dense': Mesh(...), 'expert': Mesh(...)}, "
            "or torchtitan's ParallelDims"
        )
        raise LayoutError(msg)
    return roles


def _run_axes(mesh: Mesh) -> tuple[str, ...]:
    """``mesh``'s axes as torchtitan runs on them: a source axis of one rank left out."""
    return tuple(name for name, size in mesh.axes if size > 1 or name in FSDP_OWNED_AXES)


def table_from_torchtitan(model: nn.Module, meshes: object) -> ParamLayoutTable:
    """The complete table torchtitan's parallelism gives ``model``, in one call.

    ``plan_from_torchtitan`` read on the run's meshes, built (the routed experts on the
    expert mesh when ``ep`` has more than one rank), and completed: every parameter named
    as the state dict names it, each alias of a tied parameter included (the embedding and
    the output head torchtitan ties again), parameters no module declares sharded plain
    tensors (``dense[]``). ``meshes`` is torchtitan's ``ParallelDims`` for the run, or the
    meshes by role, ``{"dense": Mesh(...), "expert": Mesh(...)}``; ``tp`` (on the dense
    mesh) and ``ep`` (on the expert mesh) are read when they have more than one rank, as
    torchtitan leaves a degree of 1 out.

    Compose it with ``compose_table(..., shard_dim=shard_dims_from_torchtitan(...))`` for
    the layouts FSDP gives.

    Raises:
        BindError: ``model`` is not an ``nn.Module``.
        LayoutError: ``meshes`` is neither a ``ParallelDims`` nor meshes by role
            (naming it); what ``plan_from_torchtitan``, ``build_table`` and
            ``complete_default`` raise (a ``PlanError`` holding every problem).
    """
    check_module(model, "table_from_torchtitan(model=...)")
    roles = _titan_meshes(meshes)
    dense, expert = roles["dense"], roles.get("expert")
    tp = "tp" if dense.get("tp", 1) > 1 else None
    ep = "ep" if expert is not None and expert.get("ep", 1) > 1 else None
    run_axes = dict.fromkeys(name for mesh in roles.values() for name in _run_axes(mesh))
    plan = plan_from_torchtitan(model, mesh_axes=list(run_axes), tp_axis=tp, ep_axis=ep)
    expert_axes = None if expert is None or ep is None else _run_axes(expert)
    return _complete(model, plan, _run_axes(dense), expert_axes)
