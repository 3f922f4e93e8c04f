"""A real model's complete table in one call, from its transformers or torch plan.

Each is the composition of the importer, ``build_table`` and ``complete_default``: the
parameters the plan places, then every other parameter as the plain tensor torch and
transformers leave it, and every tie the library keeps, so the axes are spelled once
and no FQN is listed by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from layout_algebra._args import as_items
from layout_algebra.algebra import build_table, complete_default
from layout_algebra.axes import AxisLike, as_axes, as_axis
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.mesh import Mesh
from layout_algebra.plan import ShardingPlan
from layout_algebra.torch_bridge._checks import check_module
from layout_algebra.torch_bridge._walk import named_parameters
from layout_algebra.torch_bridge.parallelize import ParallelizePlan, plan_from_parallelize
from layout_algebra.torch_bridge.transformers import plan_from_hf

__all__ = ["table_from_hf", "table_from_parallelize"]

_EXAMPLE = "('fsdp', 'tp')"


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
    return complete_default(table, names, dense, plain=True, tied_pairs=plan.tied_pairs)


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
    the tensor-parallel size is read from the dense mesh, for transformers' unit styles.

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
            raise (a ``PlanError`` holding every problem of the plan).
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
    plan = plan_from_hf(model, tp_axis=tp_axis, ep_axis=ep, mesh_axes=run_axes, tp_size=tp_size)
    return _complete(model, plan, dense, expert)


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
