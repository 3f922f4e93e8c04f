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
from json.encoder import encode_basestring_ascii
from typing import Final

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
    texts = {layout: json.dumps(layout_obj(layout)) for layout in set(table.values())}
    doc = _table_doc(table, None)
    entries = zip(table, map(texts.__getitem__, table.values()), strict=True)
    lines = {"entries": _object_lines(entries, 1)}
    dropped = doc.get("dropped")
    if isinstance(dropped, list):
        lines["dropped"] = _array_lines(map(json.dumps, dropped), 1)
    return _lay_out(doc, lines)


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
    items = ((name, _module_text(obj, 2)) for name, obj in modules.items())
    return _lay_out(doc, {"modules": _object_lines(items, 1)})


def _module_text(obj: Mapping[str, object], indent: int) -> str:
    """A module's object on one line, but its parameters one per line."""
    items = []
    for key, value in obj.items():
        if key == "params":
            assert isinstance(value, Mapping)
            text = _object_lines(((k, json.dumps(v)) for k, v in value.items()), indent)
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
    params = _object_lines(((fqn, texts[shape]) for fqn, shape in items), 1)
    return _lay_out(shapes_obj(()), {"params": params})


def _lay_out(doc: Mapping[str, object], lines: Mapping[str, str]) -> str:
    """The document's fields one per line: those ``lines`` has, as the text it gives
    (laid out one item per line), the rest as ``json.dumps`` writes them."""
    fields = (
        f"{encode_basestring_ascii(key)}: {lines[key] if key in lines else json.dumps(value)}"
        for key, value in doc.items()
    )
    return "{" + ",\n ".join(fields) + "}"


def _object_lines(items: Iterable[tuple[str, str]], indent: int) -> str:
    """A JSON object of keys and their values' text, one item per line (``{}`` if empty)."""
    pad = " " * (indent + 1)
    lines = f",\n{pad}".join(f"{encode_basestring_ascii(k)}: {v}" for k, v in items)
    return f"{{\n{pad}{lines}\n{' ' * indent}}}" if lines else "{}"


def _array_lines(texts: Iterable[str], indent: int) -> str:
    """A JSON array of its items' text, one item per line (``[]`` if empty)."""
    pad = " " * (indent + 1)
    lines = f",\n{pad}".join(texts)
    return f"[\n{pad}{lines}\n{' ' * indent}]" if lines else "[]"
