"""Writing the JSON documents: each value's unstructured object, and its text.

Each document has one function that writes its envelope (``_table_doc``, ``plan_obj``,
``shapes_obj``); the ``*_text`` functions lay that document out for people: its fields one
per line, a table's entries, drops, a plan's parameters and a shapes document's
parameters one per line, everything else as ``json.dumps`` writes it (ASCII, so any FQN
is safe). A table's layouts and a model's shapes repeat: the text of each distinct value
is made once and shared by every line that holds it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from itertools import chain, repeat
from json.encoder import encode_basestring_ascii
from typing import Final

from layout_algebra._grouping import OncePerKey
from layout_algebra.layout import Drop, ParamLayoutTable, SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.placements import format_placement
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import structure_to_obj

__all__ = [
    "FINGERPRINT",
    "FORMAT_VERSION",
    "layout_obj",
    "mesh_obj",
    "module_obj",
    "plan_obj",
    "plan_text",
    "shape_obj",
    "shapes_obj",
    "shapes_text",
    "table_obj",
    "table_text",
]

FORMAT_VERSION: Final = 1
"""The version written into, and required of, every document."""

FINGERPRINT: Final = "fingerprint"
"""The field of a table document holding ``ParamLayoutTable.fingerprint()``."""


def layout_obj(layout: SourceLayout) -> dict[str, object]:
    return {
        "mesh": layout.mesh,
        "axes": [a.name for a in layout.axes],
        "placements": [format_placement(p) for p in layout.placements],
    }


def _drop_obj(drop: Drop) -> dict[str, object]:
    return {
        "fqn": drop.fqn,
        "mesh": drop.mesh,
        "axis": drop.axis.name,
        "placement": format_placement(drop.placement),
    }


def _table_doc(table: ParamLayoutTable, entries: object) -> dict[str, object]:
    """The table's document around ``entries``: the one place its envelope is written
    (``"dropped"`` only when something was, so a table without drops reads as before)."""
    doc: dict[str, object] = {
        "version": FORMAT_VERSION,
        "entries": entries,
        "tied": [sorted(g) for g in table.tied],
    }
    if table.dropped:
        doc["dropped"] = [_drop_obj(d) for d in table.dropped]
    doc[FINGERPRINT] = table.fingerprint()
    return doc


def table_obj(table: ParamLayoutTable) -> dict[str, object]:
    """The table's document, every layout as its object (one object per distinct layout)."""
    objs = {layout: layout_obj(layout) for layout in set(table.values())}
    return _table_doc(table, {fqn: objs[layout] for fqn, layout in table.items()})


def table_text(table: ParamLayoutTable) -> str:
    """The table's document as text, one entry per line, one drop per line."""
    doc = _table_doc(table, None)
    lines = {
        "entries": _object_lines(
            table, map(OncePerKey(_layout_text).__getitem__, table.values()), 1
        )
    }
    dropped = doc.get("dropped")
    if isinstance(dropped, list):
        lines["dropped"] = _array_lines(map(json.dumps, dropped), 1)
    return _lay_out(doc, lines)


def _layout_text(layout: SourceLayout) -> str:
    return json.dumps(layout_obj(layout))


def module_obj(spec: ModulePlan) -> dict[str, object]:
    return {
        "expert_parallel": spec.expert_parallel,
        "params": {
            path: {axis: format_placement(p) for axis, p in named.items()}
            for path, named in spec.params.items()
        },
    }


def plan_obj(plan: ShardingPlan) -> dict[str, object]:
    """The plan's document: the one place its envelope is written."""
    return {
        "version": FORMAT_VERSION,
        "mesh_axes": [a.name for a in plan.mesh_axes],
        "tied_pairs": [list(p) for p in plan.tied_pairs],
        "modules": {name: module_obj(spec) for name, spec in plan.modules.items()},
    }


def plan_text(plan: ShardingPlan) -> str:
    """The plan's document as text, one parameter per line within its module's object."""
    doc = plan_obj(plan)
    modules = doc["modules"]
    assert isinstance(modules, dict)
    texts = (_module_text(obj, 2) for obj in modules.values())
    return _lay_out(doc, {"modules": _object_lines(modules, texts, 1)})


def _module_text(obj: Mapping[str, object], indent: int) -> str:
    """A module's object on one line, but its parameters one per line."""
    items = []
    for key, value in obj.items():
        if key == "params":
            assert isinstance(value, Mapping)
            text = "".join(_object_lines(value, map(json.dumps, value.values()), indent))
        else:
            text = json.dumps(value)
        items.append(f"{encode_basestring_ascii(key)}: {text}")
    return "{" + ", ".join(items) + "}"


def mesh_obj(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.axes)


def shape_obj(shape: ParamShape) -> dict[str, object]:
    """A shape's object (``"structure"`` only when it has one, so a plain shape reads as
    before)."""
    obj: dict[str, object] = {"shape": list(shape.shape), "dtype": shape.dtype}
    if shape.structure:
        obj["structure"] = structure_to_obj(shape.structure)
    return obj


def shapes_obj(shapes: Iterable[tuple[str, ParamShape]]) -> dict[str, object]:
    """A shapes document of the shapes' items: the one place its envelope is written."""
    objs: dict[ParamShape, dict[str, object]] = {}  # models repeat a few shapes
    params: dict[str, object] = {}
    for fqn, shape in shapes:
        obj = objs.get(shape)
        if obj is None:
            obj = objs[shape] = shape_obj(shape)
        params[fqn] = obj
    return {"version": FORMAT_VERSION, "params": params}


def shapes_text(shapes: Iterable[tuple[str, ParamShape]]) -> str:
    """A shapes document as text, one parameter per line."""
    items = list(shapes)
    texts = {shape: json.dumps(shape_obj(shape)) for shape in {shape for _, shape in items}}
    params = _object_lines([fqn for fqn, _ in items], (texts[shape] for _, shape in items), 1)
    return _lay_out(shapes_obj(()), {"params": params})


def _lay_out(doc: Mapping[str, object], parts: Mapping[str, list[str]]) -> str:
    """The document's fields one per line: those ``parts`` has, as the text its pieces
    spell (laid out one item per line), the rest as ``json.dumps`` writes them. The pieces
    are joined once, so a large table's text is not copied field by field."""
    out = ["{"]
    for key, value in doc.items():
        out.extend((",\n " if len(out) > 1 else "", encode_basestring_ascii(key), ": "))
        if key in parts:
            out.extend(parts[key])
        else:
            out.append(json.dumps(value))
    out.append("}")
    return "".join(out)


def _object_lines(keys: Iterable[str], texts: Iterable[str], indent: int) -> list[str]:
    """The pieces of a JSON object of ``keys`` and their values' ``texts`` (in the same
    order), one item per line (``{}`` if empty)."""
    pad = " " * (indent + 1)
    # key, ": ", text, separator, ...: no string is made per item
    items = zip(map(encode_basestring_ascii, keys), repeat(": "), texts, repeat(f",\n{pad}"))
    parts = [f"{{\n{pad}", *chain.from_iterable(items)]
    if len(parts) == 1:
        return ["{}"]
    parts[-1] = f"\n{' ' * indent}}}"  # the last separator closes the object
    return parts


def _array_lines(texts: Iterable[str], indent: int) -> list[str]:
    """The pieces of a JSON array of its items' text, one item per line (``[]`` if
    empty)."""
    pad = " " * (indent + 1)
    lines = f",\n{pad}".join(texts)
    return [f"[\n{pad}{lines}\n{' ' * indent}]" if lines else "[]"]
