"""Versioned JSON for tables, plans and shapes, and the cattrs hooks that read and write them.

The documents are meant to be read by people: placements in the DSL (``"S(0)"``), one
table entry per line::

    {"version": 1,
     "entries": {
      "emb.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]}
     },
     "tied": [["emb.weight", "head.weight"]],
     "fingerprint": "..."}

A table that ``build_table`` dropped placements for also has ``"dropped"``, one object a
drop (``{"fqn": ..., "mesh": ..., "axis": ..., "placement": "S(0)"}``); a document
without it has none. ``"fingerprint"`` is ``ParamLayoutTable.fingerprint()`` of the
table written (its entries and tied groups, as table equality has them; the drops are a
record outside it): a document whose table no longer has it was changed after it was
written, and is refused until the field is deleted; a document without it is read as it
is.

Reading is strict: an unknown key, a duplicate key, a key that is not a string, a wrong
type, a bad placement or axis, or a table or plan that breaks its invariants raises
``SerializationError`` with the JSON path of the bad value
(``entries["layers.7.w"].placements[0]``); messages quote at most a few hundred
characters of it. Nothing in the input names a class, and nothing is executed or
imported from it.

As ``cattrs.preconf`` does, ``configure_converter(c)`` registers the hooks of every value
type on any cattrs converter (so a user's own attrs class holding a ``ParamLayoutTable``
structures with their converter), ``make_converter()`` returns a new configured one, and
``converter`` is the package's. The package's converters (``converter``,
``make_converter()``) report any failure to structure as one ``SerializationError`` with
the path of the first bad value in the object given (``[2].placements[0]``), where cattrs
itself raises a group of errors. A document's text holds exactly its unstructured
object (``converter.unstructure(table)``), laid out one entry per line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import cattrs
from cattrs.errors import AttributeValidationNote, BaseValidationError, IterableValidationNote

from layout_algebra._args import mapping_items
from layout_algebra._json_read import (
    at_field,
    at_index,
    fail,
    load,
    read_axis,
    read_layout,
    read_mesh,
    read_module,
    read_packed,
    read_param_shape,
    read_part,
    read_placement,
    read_plan,
    read_shapes,
    read_table,
    shown,
)
from layout_algebra._json_write import (
    FORMAT_VERSION,
    layout_obj,
    mesh_obj,
    module_obj,
    plan_obj,
    plan_text,
    shape_obj,
    shapes_text,
    table_obj,
    table_text,
)
from layout_algebra._text import clip, quote
from layout_algebra.activations import Activations, activations_from_obj, activations_to_obj
from layout_algebra.axes import AxisName
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.shapes import ParamShape
from layout_algebra.stages import Stages, stages_from_obj, stages_to_obj
from layout_algebra.structure import Packed, Part, packed_to_obj, part_to_obj
from layout_algebra.training import (
    FSDPUnit,
    Optimizer,
    Training,
    fsdp_unit_from_obj,
    fsdp_unit_to_obj,
    optimizer_from_obj,
    optimizer_to_obj,
    training_from_obj,
    training_to_obj,
)

__all__ = [
    "FORMAT_VERSION",
    "configure_converter",
    "converter",
    "from_json",
    "make_converter",
    "plan_from_json",
    "plan_to_json",
    "shapes_from_json",
    "shapes_to_json",
    "to_json",
]

_T = TypeVar("_T")
_C = TypeVar("_C", bound=cattrs.BaseConverter)


def _checked(value: object, kind: type[_T], fn: str) -> _T:
    if not isinstance(value, kind):
        msg = f"{fn} takes a {kind.__name__}, got {quote(value)}"
        raise SerializationError(msg, path="$")
    return value


def to_json(table: ParamLayoutTable) -> str:
    """The table as a version-1 JSON document, one entry per line (then, when
    ``table.dropped`` holds any, one drop per line after the tied groups), and its
    fingerprint last.

    >>> from layout_algebra import Shard
    >>> print(to_json(ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})))
    ... # doctest: +ELLIPSIS
    {"version": 1,
     "entries": {
      "w": {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}
     },
     "tied": [],
     "fingerprint": "..."}

    Raises:
        SerializationError: ``table`` is not a ``ParamLayoutTable``.
    """
    return table_text(_checked(table, ParamLayoutTable, "to_json"))


def from_json(text: str | bytes) -> ParamLayoutTable:
    """The table a version-1 JSON document describes.

    Raises:
        SerializationError: the text is not such a document; the message and ``.path``
            give the JSON path of the first bad value. A document whose ``"fingerprint"``
            is not the one of the table it holds was changed after it was written: the
            error gives both, and deleting the field accepts the change.
    """
    return read_table(load(text))


def plan_to_json(plan: ShardingPlan) -> str:
    """The plan as a version-1 JSON document, one parameter per line, placements in the DSL.

    >>> from layout_algebra import ModulePlan, Shard
    >>> plan = ShardingPlan({"attn": ModulePlan({"wq.weight": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    >>> print(plan_to_json(plan))
    {"version": 1,
     "mesh_axes": ["tp"],
     "tied_pairs": [],
     "modules": {
      "attn": {"expert_parallel": false, "params": {
       "wq.weight": {"tp": "S(0)"}
      }}
     }}

    Raises:
        SerializationError: ``plan`` is not a ``ShardingPlan``.
    """
    return plan_text(_checked(plan, ShardingPlan, "plan_to_json"))


def plan_from_json(text: str | bytes) -> ShardingPlan:
    """The plan a version-1 JSON document describes.

    Raises:
        SerializationError: the text is not such a document, with the path of the first
            bad value.
    """
    return read_plan(load(text))


def shapes_to_json(shapes: Mapping[str, ParamShape]) -> str:
    """Parameter shapes by FQN as a version-1 ``shapes.json``, one parameter per line.

    >>> print(shapes_to_json({"w": ParamShape((8, 4), "bfloat16")}))
    {"version": 1,
     "params": {
      "w": {"shape": [8, 4], "dtype": "bfloat16"}
     }}

    Raises:
        SerializationError: ``shapes`` is not a mapping from FQN to ``ParamShape``.
    """
    raw: object = shapes
    items = (
        mapping_items(
            raw,
            "shapes_to_json: shapes",
            "{'w': ParamShape((8, 4), 'bfloat16')}",
            error=lambda text: SerializationError(text, path="$"),
        )
        if isinstance(raw, Mapping)
        else None
    )
    if items is None or not all(
        isinstance(k, str) and k and isinstance(v, ParamShape) for k, v in items
    ):
        msg = f"shapes_to_json takes a mapping from FQN to ParamShape, got {quote(raw)}"
        raise SerializationError(msg, path="$")
    return shapes_text(items)


def shapes_from_json(text: str | bytes) -> Mapping[str, ParamShape]:
    """The parameter shapes a version-1 ``shapes.json`` gives, by FQN in document order.

    Raises:
        SerializationError: the text is not such a document, with the path of the first
            bad value.
    """
    return read_shapes(load(text))


# ---------------------------------------------------------------------------------------
# the converter


def _structure_kind(kind: type[_T]) -> Callable[[Any, Any], _T]:
    def structure(value: object, _: object) -> _T:
        placement = read_placement(value, "")
        if not isinstance(placement, kind):
            raise fail("", f"expected a {kind.__name__} placement", value)
        return placement

    return structure


def configure_converter(converter: _C) -> _C:
    """Register the hooks of every value type of the package on ``converter``.

    After it, ``converter.unstructure(table)`` gives the JSON-ready document and
    ``converter.structure(obj, ParamLayoutTable)`` reads one back strictly (the same for
    ``ShardingPlan``, ``ModulePlan``, ``SourceLayout``, ``ParamShape``, ``Mesh``,
    ``Training`` (with its ``FSDPUnit`` and ``Optimizer`` values), ``Stages``, ``Part``,
    ``Packed``, ``Activations``,
    ``AxisName``, ``Placement`` and every placement
    kind), also where they sit inside the user's own attrs classes
    (``dict[str, ParamShape]`` is a ``shapes.json``'s ``params``). A ``Part`` is
    ``{"name": "q", "count": 32, "size": 128}`` and a ``Packed`` the list of its parts, as
    a ``shapes.json`` structure holds them, read by the same code with the same refusals.

    Returns:
        ``converter`` itself.
    """
    for kind in (Shard, Replicate, Partial, StridedShard):
        converter.register_unstructure_hook(kind, format_placement)
        converter.register_structure_hook(kind, _structure_kind(kind))
    converter.register_structure_hook_func(
        lambda t: t == Placement, lambda v, _: read_placement(v, "")
    )
    converter.register_unstructure_hook(AxisName, str)
    converter.register_structure_hook(AxisName, lambda v, _: read_axis(v, ""))
    converter.register_unstructure_hook(SourceLayout, layout_obj)
    converter.register_structure_hook(SourceLayout, lambda v, _: read_layout(v, ""))
    converter.register_unstructure_hook(ParamLayoutTable, table_obj)
    converter.register_structure_hook(ParamLayoutTable, lambda v, _: read_table(v))
    converter.register_unstructure_hook(ModulePlan, module_obj)
    converter.register_structure_hook(ModulePlan, lambda v, _: read_module(v, ""))
    converter.register_unstructure_hook(Mesh, mesh_obj)
    converter.register_structure_hook(Mesh, lambda v, _: read_mesh(v, ""))
    converter.register_unstructure_hook(Part, part_to_obj)
    converter.register_structure_hook(Part, lambda v, _: read_part(v, ""))
    converter.register_unstructure_hook(Packed, packed_to_obj)
    converter.register_structure_hook(Packed, lambda v, _: read_packed(v, ""))
    converter.register_unstructure_hook(ParamShape, shape_obj)
    converter.register_structure_hook(ParamShape, lambda v, _: read_param_shape(v, ""))
    converter.register_unstructure_hook(ShardingPlan, plan_obj)
    converter.register_structure_hook(ShardingPlan, lambda v, _: read_plan(v))
    converter.register_unstructure_hook(Training, training_to_obj)
    converter.register_structure_hook(Training, lambda v, _: training_from_obj(v))
    converter.register_unstructure_hook(FSDPUnit, fsdp_unit_to_obj)
    converter.register_structure_hook(FSDPUnit, lambda v, _: fsdp_unit_from_obj(v))
    converter.register_unstructure_hook(Optimizer, optimizer_to_obj)
    converter.register_unstructure_hook(Stages, stages_to_obj)
    converter.register_structure_hook(Stages, lambda v, _: stages_from_obj(v))
    converter.register_structure_hook(Optimizer, lambda v, _: optimizer_from_obj(v))
    converter.register_unstructure_hook(Activations, activations_to_obj)
    converter.register_structure_hook(Activations, lambda v, _: activations_from_obj(v))
    return converter


def _noted(path: str, error: BaseException) -> str:
    """``path`` followed down to ``error`` by the note cattrs put on it (the index or key
    of an item, the name of an attribute), if any."""
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, IterableValidationNote):
            at = note.index
            if type(at) is int:
                return at_index(path, at)
            return f"{path}[{json.dumps(clip(at)) if isinstance(at, str) else quote(at)}]"
        if isinstance(note, AttributeValidationNote):
            return at_field(path, clip(note.name))
    return path


def _structure_error(error: Exception) -> tuple[SerializationError, Exception | None]:
    """The first failure inside what structuring raised (cattrs groups every failure of a
    class or collection, noting where each happened), as one error at its whole path,
    and the failure itself when it is not the package's own (to be its cause)."""
    path, leaf = "", error
    while isinstance(leaf, BaseValidationError) and leaf.exceptions:
        inner = leaf.exceptions[0]
        path = _noted(path, inner)
        leaf = inner
    if isinstance(leaf, SerializationError):
        inner_path = "" if leaf.path == "$" else leaf.path
        joined = not inner_path or inner_path.startswith("[")
        where = path + inner_path if joined else at_field(path, inner_path)
        what = leaf.message.removeprefix(f"{leaf.path}: ")
        at = shown(where)
        return SerializationError(f"{at}: {what}", path=at, fqn=leaf.fqn), None
    if isinstance(leaf, LayoutError):
        error = SerializationError(f"{shown(path)}: {leaf.message}", path=shown(path))
        return error, None
    what = f"could not be structured: {quote(leaf)}"
    return SerializationError(f"{shown(path)}: {what}", path=shown(path)), leaf


class _Converter(cattrs.Converter):
    """A cattrs ``Converter`` whose ``structure`` raises one ``SerializationError`` with
    the path of the first bad value, whatever failed (the hooks below it see each value
    as cattrs gives it)."""

    __slots__ = ()

    def structure(self, obj: object, cl: type[_T]) -> _T:
        try:
            return super().structure(obj, cl)
        except SerializationError:
            raise
        except Exception as e:
            error, cause = _structure_error(e)
            raise error from cause


def make_converter() -> cattrs.Converter:
    """A new cattrs ``Converter`` configured with ``configure_converter``, whose
    ``structure`` reports any failure as one ``SerializationError`` with the path of the
    first bad value (a bare cattrs converter groups them: ``cattrs.transform_error``)."""
    c = _Converter()
    configure_converter(c)
    return c


converter: Final[cattrs.Converter] = make_converter()
"""The package's configured converter: ``converter.unstructure(table)`` gives the
JSON-ready document, ``converter.structure(obj, ParamLayoutTable)`` reads one back."""
