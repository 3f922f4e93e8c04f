"""A plan's complete table for a model's parameters, and FSDP's shard dim by mesh role.

The command line's ``table --fqns`` and ``lint`` of a plan read a plan as torch's
``parallelize_module`` and transformers leave a model: the parameters the plan places,
and every other parameter a plain tensor until FSDP. Both ask this module, so a plan
and the table made of it lint alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from layout_algebra._args import as_items, mapping_items
from layout_algebra._text import quote
from layout_algebra.algebra import build_table, complete_default
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike
from layout_algebra.errors import LayoutError
from layout_algebra.layout import ParamLayoutTable, check_table
from layout_algebra.plan import ShardingPlan

__all__ = ["shard_dims_by_role", "table_from_plan"]

_FQNS_EXAMPLE: Final = "('layers.0.wq.weight', 'norm.weight')"
_DIMS_EXAMPLE: Final = "{'expert': 1}"


def table_from_plan(
    plan: ShardingPlan,
    fqns: Iterable[str],
    *,
    mesh_axes: Iterable[AxisLike],
    expert_axes: Iterable[AxisLike] | None = None,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> ParamLayoutTable:
    """The complete table of ``plan`` for a model whose parameters are ``fqns``.

    The plan's keys (patterns included) are matched against ``fqns`` and the members of
    its tied pairs (a checkpoint stores one of two tied parameters), as ``build_table``
    matches them; every FQN of ``fqns`` no key matches then gets the plain layout
    ``dense[]`` (a plain tensor until FSDP), and the plan's ties are closed over the
    whole table. ``mesh_axes`` and ``expert_axes`` are axis names in mesh order (a
    ``Mesh`` is one).

    >>> from layout_algebra import ModulePlan, Shard
    >>> plan = ShardingPlan({"layers.*.attn": ModulePlan({"wq.weight": {"tp": Shard(0)}})},
    ...                     mesh_axes=["tp"])
    >>> print(table_from_plan(plan, ["layers.0.attn.wq.weight", "norm.weight"],
    ...                       mesh_axes=["dp_shard", "tp"]))
    layers.0.attn.wq.weight  dense[tp=S(0)]
    norm.weight              dense[]

    Raises:
        PlanError: every problem of the plan, as ``build_table`` raises it (a key that
            matches none of ``fqns`` among them).
        LayoutError: an argument of the wrong type, naming it; tied parameters whose
            layouts conflict.
    """
    names = as_items(fqns, "fqns", _FQNS_EXAMPLE)
    listed = set(names)
    absent = [fqn for pair in _tied_pairs(plan) for fqn in pair if fqn not in listed]
    dense = as_items(mesh_axes, "mesh_axes", "('dp_shard', 'tp')")
    matched = build_table(
        plan,
        dense,
        expert_axes=expert_axes,
        owned=owned,
        fqns=[*names, *dict.fromkeys(absent)],
    )
    return complete_default(
        matched, names, dense, owned=owned, plain=True, tied_pairs=plan.tied_pairs
    )


def _tied_pairs(plan: object) -> tuple[tuple[str, ...], ...]:
    """The plan's tied pairs; what is not a plan is left for ``build_table`` to name."""
    if not isinstance(plan, ShardingPlan):
        return ()
    return tuple(tuple(pair) for pair in plan.tied_pairs)


def shard_dims_by_role(
    table: ParamLayoutTable, dims: Mapping[str, int], *, default: int = 0
) -> dict[str, int]:
    """The dim FSDP shards of each parameter of ``table``, given by mesh role.

    ``dims`` maps a mesh role to its dim (``{"expert": 1}``: FSDP shards the experts'
    dim 1, as torchtitan's ``shard_placement_fn`` does); a parameter of another role
    gets ``default``. The result is the ``shard_dim`` by FQN that ``compose_table`` and
    ``lint`` take.

    >>> from layout_algebra import SourceLayout
    >>> table = ParamLayoutTable({"w": SourceLayout("dense", (), ()),
    ...                           "experts.w1": SourceLayout("expert", (), ())})
    >>> shard_dims_by_role(table, {"expert": 1})
    {'w': 0, 'experts.w1': 1}

    Raises:
        LayoutError: ``table`` is not a table, or ``dims`` not a mapping of role to int.
    """
    check_table(table, "shard_dims_by_role(table=...)")
    given: object = dims
    if not isinstance(given, Mapping):
        msg = f"dims must map a mesh role to a dim such as {_DIMS_EXAMPLE}, got {quote(given)}"
        raise LayoutError(msg)
    by_role = dict(mapping_items(dims, "dims", _DIMS_EXAMPLE))
    for role, dim in [*by_role.items(), ("default", default)]:
        if type(dim) is not int or dim < 0:
            msg = f"the shard dim of {quote(role)} must be an int >= 0, got {quote(dim)}"
            raise LayoutError(msg)
    return {fqn: by_role.get(layout.mesh, default) for fqn, layout in table.items()}
