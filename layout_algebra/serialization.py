"""Versioned JSON for tables and plans, and the cattrs hooks that read and write them.

The documents are meant to be read by people: placements in the DSL (``"S(0)"``), one
table entry per line::

    {"version": 1,
     "entries": {
      "emb.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]}
     },
     "tied": [["emb.weight", "head.weight"]]}

A table that ``build_table`` dropped placements for also has ``"dropped"``, one object a
drop (``{"fqn": ..., "mesh": ..., "axis": ..., "placement": "S(0)"}``); a document
without it has none.

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
itself raises a group of errors. Each document is one unstructured object
(``_table_obj``, ``_plan_obj``); ``to_json`` and ``plan_to_json`` only lay that object
out as text.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from typing import Any, Final, TypeVar, cast

import cattrs
from cattrs.errors import AttributeValidationNote, BaseValidationError, IterableValidationNote

from layout_algebra._args import mapping_items
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisName, as_axis
from layout_algebra.errors import LayoutError, PlacementSyntaxError, SerializationError
from layout_algebra._frozen import FrozenMap
from layout_algebra.layout import Drop, ParamLayoutTable, SourceLayout, check_no_partial
from layout_algebra.layout import _CheckedEntries as CheckedEntries
from layout_algebra.mesh import Mesh
from layout_algebra.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
    parse_placement,
)
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.shapes import ParamShape

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

FORMAT_VERSION: Final = 1
"""The version written into, and required of, every document."""

_T = TypeVar("_T")
_C = TypeVar("_C", bound=cattrs.BaseConverter)
_LAYOUT_KEYS: Final = frozenset({"mesh", "axes", "placements"})
_TABLE_KEYS: Final = frozenset({"version", "entries"})
_TABLE_OPTIONAL: Final = frozenset({"tied", "dropped"})
_DROP_KEYS: Final = frozenset({"fqn", "mesh", "axis", "placement"})
_PLAN_KEYS: Final = frozenset({"version", "mesh_axes", "modules"})
_PLAN_OPTIONAL: Final = frozenset({"tied_pairs"})
_MODULE_KEYS: Final = frozenset({"params"})
_MODULE_OPTIONAL: Final = frozenset({"expert_parallel"})
_SHAPES_KEYS: Final = frozenset({"version", "params"})
_SHAPE_KEYS: Final = frozenset({"shape", "dtype"})


# ---------------------------------------------------------------------------------------
# paths and checked access


def _key(path: str, key: str) -> str:
    return f"{path}[{json.dumps(clip(key))}]" if path else clip(key)


def _field(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _shown(path: str) -> str:
    return path or "$"


def _fail(path: str, what: str, value: object, fqn: str | None = None) -> SerializationError:
    msg = f"{_shown(path)}: {what}, got {quote(value)}"
    return SerializationError(msg, path=_shown(path), fqn=None if fqn is None else clip(fqn))


def _string_keys(value: dict[Any, object], path: str) -> None:
    """JSON text always has string keys; a Python object handed to the converter may not."""
    for k in value:
        if type(k) is not str:
            where = f"{path}[{quote(k)}]" if path else quote(k)
            raise _fail(where, "keys are strings (FQNs, paths, axis names)", k)


def _object(
    value: object, path: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, object]:
    _check_unique(value, path, _field)
    if not isinstance(value, dict):
        raise _fail(path, "expected a JSON object", value)
    _string_keys(value, path)
    keys = value.keys()
    missing = required - keys
    if missing:
        name = sorted(missing)[0]
        raise _fail(_field(path, name), f"missing field {name!r}", value)
    extra = keys - required - optional
    if extra:
        name = sorted(extra)[0]
        allowed = ", ".join(sorted(required | optional))
        where = _field(path, clip(name))
        raise _fail(where, f"unknown field {clip(name)!r} (allowed: {allowed})", value[name])
    return value


def _mapping(value: object, path: str, what: str) -> dict[str, object]:
    """A JSON object of any keys (``what`` says of which), or the error at ``path``."""
    _check_unique(value, path, _key)
    if not isinstance(value, dict):
        raise _fail(path, f"expected a JSON object of {what}", value)
    _string_keys(value, path)
    return value


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise _fail(path, "expected a JSON array", value)
    return value


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, "expected a string", value)
    return value


def _fqn(value: object, path: str) -> str:
    fqn = _str(value, path)
    if not fqn:
        raise _fail(path, "a parameter FQN must be non-empty", fqn)
    return fqn


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, "expected true or false", value)
    return value


def _version(doc: dict[str, object], path: str = "") -> None:
    v = doc["version"]
    if type(v) is not int or v != FORMAT_VERSION:
        raise _fail(
            _field(path, "version"), f"unsupported version (this reads {FORMAT_VERSION})", v
        )


def _placement(value: object, path: str) -> Placement:
    text = _str(value, path)
    try:
        return parse_placement(text)
    except PlacementSyntaxError as e:
        raise _fail(path, e.message, value) from None


def _axis(value: object, path: str) -> AxisName:
    name = _str(value, path)
    try:
        return as_axis(name)
    except LayoutError as e:
        raise _fail(path, e.message, value) from None


def _named_key(keys: Iterable[str], shown: str | None) -> str | None:
    """The key an error's ``.fqn`` names (errors show long keys clipped), if any."""
    if shown is None:
        return None
    return next((k for k in keys if k == shown or clip(k) == shown), None)


def _repeat(names: Sequence[str], name: str | None) -> int | None:
    """The index where ``name`` appears in ``names`` for the second time, if it does."""
    seen = False
    for i, n in enumerate(names):
        if n == name:
            if seen:
                return i
            seen = True
    return None


def _wrap(
    path: str,
    build: Callable[[], _T],
    locate: Callable[[LayoutError], str | None] = lambda _: None,
    fqn: str | None = None,
) -> _T:
    """``build()``; its ``LayoutError`` becomes a ``SerializationError`` at the path
    ``locate`` finds for it (the bad value), else at ``path``."""
    try:
        return build()
    except SerializationError:
        raise
    except LayoutError as e:
        where = _shown(locate(e) or path)
        msg = f"{where}: {e.message}"
        shown = fqn if fqn is not None else e.fqn
        raise SerializationError(msg, path=where, fqn=shown) from None


def _fails(build: Callable[[], object]) -> bool:
    try:
        build()
    except LayoutError:
        return True
    return False


# ---------------------------------------------------------------------------------------
# reading


def _layout(value: object, path: str) -> SourceLayout:
    doc = _object(value, path, _LAYOUT_KEYS)
    mesh = _str(doc["mesh"], _field(path, "mesh"))
    axes_path, placements_path = _field(path, "axes"), _field(path, "placements")
    axes = [_axis(a, _index(axes_path, i)) for i, a in enumerate(_list(doc["axes"], axes_path))]
    placements = [
        _placement(p, _index(placements_path, i))
        for i, p in enumerate(_list(doc["placements"], placements_path))
    ]

    def locate(e: LayoutError) -> str | None:
        if len(axes) != len(placements):
            return placements_path
        repeat = _repeat([a.name for a in axes], e.axis)
        if repeat is not None:
            return _index(axes_path, repeat)
        if _fails(lambda: SourceLayout(mesh, (), ())):
            return _field(path, "mesh")
        return None

    return _wrap(path, lambda: SourceLayout(mesh, axes, placements), locate)


def _memo_key(raw: object) -> tuple[object, ...] | None:
    """A hashable spelling of a well-shaped entry, or ``None`` (then it is read in full)."""
    if type(raw) is dict and raw.keys() == _LAYOUT_KEYS:
        axes, placements = raw["axes"], raw["placements"]
        if type(axes) is list and type(placements) is list:
            key = (raw["mesh"], *axes, None, *placements)
            try:
                hash(key)
            except TypeError:  # a list or object inside: the full read reports it
                return None
            return key
    return None


def _entry(fqn: str, raw: object, where: str) -> SourceLayout:
    """One table entry, read in full: a layout with no ``Partial``."""
    layout = _layout(raw, where)
    for i, p in enumerate(layout.placements):
        if isinstance(p, Partial):
            path = _index(_field(where, "placements"), i)
            _wrap(path, lambda: check_no_partial(fqn, layout), fqn=fqn)
    return layout


def _tied_groups(value: object, path: str, entries: Mapping[str, SourceLayout]) -> list[list[str]]:
    groups: list[list[str]] = []
    for i, raw_group in enumerate(_list(value, path)):
        group_path = _index(path, i)
        members = [
            _fqn(m, _index(group_path, j)) for j, m in enumerate(_list(raw_group, group_path))
        ]
        for j, m in enumerate(members):
            if m not in entries:
                raise _fail(_index(group_path, j), "tied member has no entry in the table", m, m)
        groups.append(members)
    return groups


def _drop(value: object, path: str) -> Drop:
    doc = _object(value, path, _DROP_KEYS)
    fqn = _fqn(doc["fqn"], _field(path, "fqn"))
    mesh = _str(doc["mesh"], _field(path, "mesh"))
    axis = _axis(doc["axis"], _field(path, "axis"))
    placement = _placement(doc["placement"], _field(path, "placement"))
    # the FQN, axis and placement are checked: only the mesh role can be bad
    return _wrap(_field(path, "mesh"), lambda: Drop(fqn, mesh, axis, placement), fqn=fqn)


def _drops(value: object, path: str) -> list[Drop]:
    """The drops of a table document (``build_table`` drops a kind of placement on many
    parameters: each spelling of mesh, axis and placement is read once)."""
    out: list[Drop] = []
    seen: dict[tuple[str, str, str], Drop] = {}
    for i, raw in enumerate(_list(value, path)):
        key = None
        if type(raw) is dict and raw.keys() == _DROP_KEYS:
            fqn, mesh, axis, placement = raw["fqn"], raw["mesh"], raw["axis"], raw["placement"]
            if type(mesh) is str and type(axis) is str and type(placement) is str:
                key = (mesh, axis, placement)
                known = seen.get(key)
                if known is not None and type(fqn) is str and fqn:
                    out.append(Drop(fqn, known.mesh, known.axis, known.placement))
                    continue
        drop = _drop(raw, _index(path, i))
        if key is not None:
            seen[key] = drop
        out.append(drop)
    return out


def _table(value: object, path: str = "") -> ParamLayoutTable:
    doc = _object(value, path, _TABLE_KEYS, _TABLE_OPTIONAL)
    _version(doc, path)
    entries_path = _field(path, "entries")
    raw_entries = _mapping(doc["entries"], entries_path, "FQN -> layout")
    # A copy of the document's entries, each value then replaced by its layout: the copy
    # has every key already, in order, so filling it never grows it. Every value is
    # replaced below before the table sees it (an error discards the copy).
    entries = CheckedEntries(cast("dict[str, SourceLayout]", raw_entries))
    # Equal layouts are written alike: read each spelling once and share the value.
    seen: dict[tuple[object, ...], SourceLayout] = {}
    for fqn, raw in raw_entries.items():
        if not fqn:
            raise _fail(_key(entries_path, fqn), "a parameter FQN must be non-empty", fqn)
        layout = None
        memo_key = _memo_key(raw)
        if memo_key is not None:
            layout = seen.get(memo_key)
        if layout is None:
            layout = _entry(fqn, raw, _key(entries_path, fqn))
            if memo_key is not None:
                seen[memo_key] = layout
        entries[fqn] = layout
    tied_path = _field(path, "tied")
    groups = _tied_groups(doc.get("tied", []), tied_path, entries)
    drops = _drops(doc.get("dropped", []), _field(path, "dropped"))

    def locate(e: LayoutError) -> str | None:
        # a member in two groups, at its second; else the first group bad on its own
        holding = [i for i, group in enumerate(groups) if e.fqn in group]
        if len(holding) > 1:
            i = holding[1]
            return _index(_index(tied_path, i), groups[i].index(str(e.fqn)))
        for i, group in enumerate(groups):
            alone = {m: entries[m] for m in group}
            if _fails(lambda: ParamLayoutTable(alone, tied=[group])):  # noqa: B023
                return _index(tied_path, i)
        return tied_path if groups else None

    return _wrap(path, lambda: ParamLayoutTable(entries, tied=groups, dropped=drops), locate)


def _named(value: object, path: str) -> dict[str, Placement]:
    out: dict[str, Placement] = {}
    for axis, p in _mapping(value, path, "axis -> placement").items():
        where = _key(path, axis)
        out[_axis(axis, where).name] = _placement(p, where)
    return out


def _module(value: object, path: str) -> ModulePlan:
    doc = _object(value, path, _MODULE_KEYS, _MODULE_OPTIONAL)
    params_path = _field(path, "params")
    raw_params = _mapping(doc["params"], params_path, "parameter path -> placements")
    params = {name: _named(named, _key(params_path, name)) for name, named in raw_params.items()}
    expert = _bool(doc.get("expert_parallel", False), _field(path, "expert_parallel"))

    def locate(e: LayoutError) -> str | None:
        name = _named_key(params, e.fqn)
        if name is None:
            return None
        where = _key(params_path, name)
        return _key(where, e.axis) if e.axis in params[name] else where

    return _wrap(path, lambda: ModulePlan(params, expert_parallel=expert), locate)


def _plan(value: object, path: str = "") -> ShardingPlan:
    doc = _object(value, path, _PLAN_KEYS, _PLAN_OPTIONAL)
    _version(doc, path)
    axes_path = _field(path, "mesh_axes")
    mesh_axes = [
        _axis(a, _index(axes_path, i)) for i, a in enumerate(_list(doc["mesh_axes"], axes_path))
    ]
    modules_path = _field(path, "modules")
    raw_modules = _mapping(doc["modules"], modules_path, "module FQN -> module plan")
    modules = {name: _module(spec, _key(modules_path, name)) for name, spec in raw_modules.items()}
    pairs_path = _field(path, "tied_pairs")
    pairs: list[tuple[str, str]] = []
    for i, raw_pair in enumerate(_list(doc.get("tied_pairs", []), pairs_path)):
        pair_path = _index(pairs_path, i)
        pair = _list(raw_pair, pair_path)
        if len(pair) != 2:
            raise _fail(pair_path, "a tied pair is an array of two FQNs", pair)
        pairs.append((_fqn(pair[0], _index(pair_path, 0)), _fqn(pair[1], _index(pair_path, 1))))

    def locate(e: LayoutError) -> str | None:
        repeat = _repeat([a.name for a in mesh_axes], e.axis)
        if repeat is not None:
            return _index(axes_path, repeat)
        name = _named_key(modules, e.fqn)
        return None if name is None else _key(modules_path, name)

    return _wrap(path, lambda: ShardingPlan(modules, mesh_axes=mesh_axes, tied_pairs=pairs), locate)


def _mesh(value: object, path: str) -> Mesh:
    """A ``Mesh`` from its JSON object: axis name to size, in mesh order."""
    if type(value) is not dict:
        raise _fail(
            path, 'expected a mesh: an object of axis name to size, such as {"tp": 4}', value
        )
    _string_keys(value, path)
    for name, size in value.items():
        if type(size) is not int:
            raise _fail(_key(path, name), "expected a mesh size (an int >= 1)", size)

    def locate(e: LayoutError) -> str | None:
        return None if e.axis is None or e.axis not in value else _key(path, e.axis)

    return _wrap(path, lambda: Mesh(value), locate)


def _mesh_obj(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.axes)


def _param_shape(value: object, path: str) -> ParamShape:
    doc = _object(value, path, _SHAPE_KEYS)
    shape_path, dtype_path = _field(path, "shape"), _field(path, "dtype")
    sizes = _list(doc["shape"], shape_path)
    for i, n in enumerate(sizes):
        if type(n) is not int:
            raise _fail(_index(shape_path, i), "expected a size (an int >= 0)", n)
    dtype = _str(doc["dtype"], dtype_path)

    def locate(_: LayoutError) -> str | None:
        if _fails(lambda: ParamShape((), dtype)):
            return dtype_path
        for i, n in enumerate(cast("list[int]", sizes)):
            if _fails(lambda: ParamShape((n,), "float32")):  # noqa: B023 (called at once)
                return _index(shape_path, i)
        return shape_path

    return _wrap(path, lambda: ParamShape(cast("list[int]", sizes), dtype), locate)


_INT: Final = frozenset({int})


def _shapes(value: object, path: str = "") -> FrozenMap[str, ParamShape]:
    doc = _object(value, path, _SHAPES_KEYS)
    _version(doc, path)
    params_path = _field(path, "params")
    raw = _mapping(doc["params"], params_path, "FQN -> shape and dtype")
    seen: dict[tuple[object, ...], ParamShape] = {}
    out: dict[str, ParamShape] = {}
    for fqn, spec in raw.items():
        where = _key(params_path, fqn)
        if not fqn:
            raise _fail(where, "a parameter FQN must be non-empty", fqn)
        key: tuple[object, ...] | None = None
        if (
            type(spec) is dict
            and spec.keys() == _SHAPE_KEYS
            and type(spec["shape"]) is list
            and set(map(type, spec["shape"])) <= _INT  # true and 1.0 equal 1, but are no size
        ):
            key = (spec["dtype"], *spec["shape"])
            try:
                hash(key)
            except TypeError:
                key = None
        shape = seen.get(key) if key is not None else None
        if shape is None:
            shape = _param_shape(spec, where)
            if key is not None:
                seen[key] = shape
        out[fqn] = shape
    return FrozenMap(out)


class _Duplicated(dict[str, object]):
    """A JSON object that spelled a key twice; reported where the reader meets it."""

    __slots__ = ("key",)

    def __init__(self, pairs: list[tuple[str, object]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        return _Duplicated(pairs, next(k for i, k in enumerate(keys) if k in keys[:i]))
    return out


def _check_unique(value: object, path: str, at: Callable[[str, str], str]) -> None:
    """A key spelled twice would silently drop a value: refuse it, at its path."""
    if isinstance(value, _Duplicated):
        where = at(path, value.key)
        msg = f"key {clip(value.key)!r} appears twice in one JSON object; give each key once"
        raise _fail(where, msg, value.key)


def _reject_constant(name: str) -> object:
    raise _NonFinite(name)


class _NonFinite(Exception):
    pass


def _load(text: str | bytes) -> object:
    if not isinstance(text, str | bytes | bytearray):
        raise _fail("", "expected JSON text", text)
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_reject_constant)
    except _NonFinite as e:
        raise _fail("", "NaN and Infinity are not JSON", str(e)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise _fail("", f"not valid JSON ({clip(str(e))})", text[:40]) from None


# ---------------------------------------------------------------------------------------
# writing: each document is one object; the text lays that object out


def _layout_obj(layout: SourceLayout) -> dict[str, object]:
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


def _table_doc(table: ParamLayoutTable, entries: Mapping[str, object]) -> dict[str, object]:
    """The table's document around ``entries``: the one place its envelope is written
    (``"dropped"`` only when something was, so a table without drops reads as before)."""
    doc: dict[str, object] = {
        "version": FORMAT_VERSION,
        "entries": entries,
        "tied": [sorted(g) for g in table.tied],
    }
    if table.dropped:
        doc["dropped"] = [_drop_obj(d) for d in table.dropped]
    return doc


def _table_obj(table: ParamLayoutTable) -> dict[str, object]:
    """The table's document, every layout as its object."""
    # Tables share layout objects: write each distinct one once (by id: the list holds
    # them all), then pair the FQNs with those objects without a Python loop per entry.
    layouts = list(table.values())
    distinct = dict(zip(map(id, layouts), layouts, strict=True))
    objs = {key: _layout_obj(layout) for key, layout in distinct.items()}
    return _table_doc(
        table, dict(zip(table.keys(), map(objs.__getitem__, map(id, layouts)), strict=True))
    )


def _module_obj(spec: ModulePlan) -> dict[str, object]:
    return {
        "expert_parallel": spec.expert_parallel,
        "params": {
            path: {axis: format_placement(p) for axis, p in named.items()}
            for path, named in spec.params.items()
        },
    }


def _plan_obj(plan: ShardingPlan) -> dict[str, object]:
    """The plan's document: the one place its envelope is written."""
    return {
        "version": FORMAT_VERSION,
        "mesh_axes": [a.name for a in plan.mesh_axes],
        "tied_pairs": [list(p) for p in plan.tied_pairs],
        "modules": {name: _module_obj(spec) for name, spec in plan.modules.items()},
    }


def _shape_obj(shape: ParamShape) -> dict[str, object]:
    return {"shape": list(shape.shape), "dtype": shape.dtype}


def _shapes_obj(shapes: Iterable[tuple[str, ParamShape]]) -> dict[str, object]:
    """A shapes document of the shapes' items: the one place its envelope is written."""
    # Models repeat a few shapes: each equal one is written once (by value, so a mapping
    # that builds its values afresh, freeing each after use, cannot recycle a key).
    cache: dict[ParamShape, dict[str, object]] = {}
    params: dict[str, object] = {}
    for fqn, shape in shapes:
        obj = cache.get(shape)
        if obj is None:
            obj = cache[shape] = _shape_obj(shape)
        params[fqn] = obj
    return {"version": FORMAT_VERSION, "params": params}


_TABLE_SPREAD: Final = frozenset({"entries", "dropped"})
_SHAPES_SPREAD: Final = frozenset({"params"})
_PLAN_SPREAD: Final = frozenset({"modules", "modules.*.params"})
"""The objects and arrays of a document laid out one item per line (by path, ``*`` for
any key); everything else is written on one line."""


def _dumps_cached(cache: dict[int, str]) -> Callable[[object], str]:
    """``json.dumps``, remembering the text of each object (documents share layouts)."""

    def dumps(value: object) -> str:
        text = cache.get(id(value))
        if text is None:
            text = cache[id(value)] = json.dumps(value)
        return text

    return dumps


def _lay_out(
    doc: Mapping[str, object],
    spread: frozenset[str],
    objs: Mapping[str, Callable[[Any], object]] | None = None,
) -> str:
    """The document as text: its fields one per line, the objects ``spread`` names one
    item per line, the rest as ``json.dumps`` writes it (ASCII, so any FQN is safe).

    ``objs`` maps the path of a spread object's items (``entries.*``) to what makes each
    item its JSON object, when the document holds the values themselves there (a
    table's layouts): each distinct one is made and written once.
    """
    dumps = _dumps_cached({})
    quote_key = encode_basestring_ascii  # what dumps does with a str, without its set-up
    # the paths of objects that hold a spread object deeper down: written inline, by item
    holders = {p.rsplit(".", 1)[0] for p in spread if "." in p}
    made = {} if objs is None else objs

    def value(v: object, path: str, indent: int) -> str:
        if isinstance(v, list) and path in spread:
            return _spread_list(v, indent, dumps)
        if isinstance(v, Mapping):
            if path in spread:
                if not v:
                    return "{}"
                pad, inner = " " * (indent + 1), f"{path}.*"
                if inner in spread or inner in holders:
                    lines = [
                        f"{pad}{quote_key(k)}: {value(x, inner, indent + 1)}" for k, x in v.items()
                    ]
                    return "{\n" + ",\n".join(lines) + "\n" + " " * indent + "}"
                return _spread_flat(v, pad, indent, made.get(inner), dumps)
            if path in holders:
                items = [f"{quote_key(k)}: {value(x, f'{path}.{k}', indent)}" for k, x in v.items()]
                return "{" + ", ".join(items) + "}"
        return dumps(v)

    fields = [f"{quote_key(k)}: {value(v, k, 1)}" for k, v in doc.items()]
    return "{" + ",\n ".join(fields) + "}"


def _spread_list(items: list[object], indent: int, dumps: Callable[[object], str]) -> str:
    """An array one item per line, each as ``json.dumps`` writes it (``[]`` when empty)."""
    if not items:
        return "[]"
    pad = " " * (indent + 1)
    lines = ",\n".join(pad + dumps(x) for x in items)
    return f"[\n{lines}\n{' ' * indent}]"


def _spread_flat(
    v: Mapping[str, object],
    pad: str,
    indent: int,
    make: Callable[[Any], object] | None,
    dumps: Callable[[object], str],
) -> str:
    """A non-empty object one item per line, each item as ``json.dumps`` writes it (or
    its object, ``make(item)``).

    Each distinct item is written once, and the text joined in one go from its pieces:
    ``"key"``, then ``: value,\n`` and the next line's pad (the last without them).
    """
    items = list(v.values())
    distinct = dict(zip(map(id, items), items, strict=True))
    if make is None:
        texts = {key: dumps(x) for key, x in distinct.items()}
    else:  # made objects are new: never in dumps' cache by id
        texts = {key: json.dumps(make(x)) for key, x in distinct.items()}
    after = {key: f": {text},\n{pad}" for key, text in texts.items()}
    keys = map(encode_basestring_ascii, v)
    rest = map(after.__getitem__, map(id, items))
    pieces = ["{\n", pad]
    pieces.extend(chain.from_iterable(zip(keys, rest, strict=True)))
    pieces[-1] = f": {texts[id(items[-1])]}\n{' ' * indent}}}"
    return "".join(pieces)


def _checked(value: object, kind: type[_T], fn: str) -> _T:
    if not isinstance(value, kind):
        msg = f"{fn} takes a {kind.__name__}, got {quote(value)}"
        raise SerializationError(msg, path="$")
    return value


def to_json(table: ParamLayoutTable) -> str:
    """The table as a version-1 JSON document, one entry per line (then, when
    ``table.dropped`` holds any, one drop per line after the tied groups).

    >>> from layout_algebra import Shard
    >>> print(to_json(ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})))
    {"version": 1,
     "entries": {
      "w": {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}
     },
     "tied": []}

    Raises:
        SerializationError: ``table`` is not a ``ParamLayoutTable``.
    """
    checked = _checked(table, ParamLayoutTable, "to_json")
    return _lay_out(_table_doc(checked, checked), _TABLE_SPREAD, {"entries.*": _layout_obj})


def from_json(text: str | bytes) -> ParamLayoutTable:
    """The table a version-1 JSON document describes.

    A document exactly as ``to_json`` writes it is read by its lines (each distinct
    layout once); any other text, or one that does not come out identical when written
    again, is read by the strict reader, which reports the first bad value.

    Raises:
        SerializationError: the text is not such a document; the message and ``.path``
            give the JSON path of the first bad value.
    """
    table = _read_written(text)
    if table is not None:
        return table
    return _table(_load(text))


_HEAD: Final = f'{{"version": {FORMAT_VERSION},\n "entries": {{\n  "'
_NEXT: Final = '\n  "'
_SPLIT: Final = '": {"mesh": '
_TIED: Final = '\n },\n "tied": '
_DROPPED: Final = ',\n "dropped": '
"""The fixed pieces of a table document as ``to_json`` writes it: its head, what
begins each entry after the first, what follows each entry's FQN, what ends the
entries, what follows the tied groups when there are drops."""


def _written_entries(text: str) -> tuple[list[str], list[str], str] | None:
    """A document as ``to_json`` lays it out, split: the FQNs, each one's layout text
    (its comma kept) and the text after the entries (the tied groups, and the drops
    after ``_DROPPED``); ``None`` when the text is not laid out so.

    The text is ``_HEAD``, then ``fqn + _SPLIT + layout`` per entry joined by ``_NEXT``,
    then ``_TIED``, the tied groups (and the drops) and ``}``: exactly, since each piece
    is split once; every FQN is non-empty and one JSON writes as it is.
    """
    end = text.rfind(_TIED)
    if not text.startswith(_HEAD) or not text.endswith("]}") or end < len(_HEAD):
        return None
    pieces = text[len(_HEAD) : end].split(_NEXT)
    pairs = list(map(str.split, pieces, repeat(_SPLIT), repeat(1)))
    del pieces
    try:
        fqns = list(map(itemgetter(0), pairs))
        tails = list(map(itemgetter(1), pairs))
    except IndexError:  # a piece that is not `fqn": {"mesh": ...`
        return None
    # FQNs JSON writes as they are: printable ASCII (no newline), no quote, no backslash
    joined = "".join(fqns)
    if not joined.isascii() or not joined.isprintable() or '"' in joined or "\\" in joined:
        return None
    return (fqns, tails, text[end + len(_TIED) : -1]) if all(fqns) else None


def _read_written(text: object) -> ParamLayoutTable | None:
    """The table of a document laid out exactly as ``to_json`` lays it out, else ``None``.

    Every entry of such a document is ``  "fqn": {"mesh": ...},`` on a line of its own:
    the entries are split apart at C speed (``_written_entries``), each distinct layout
    text is read by the strict reader and must be written the way ``to_json`` writes it,
    and the tied groups and drops likewise. So the text is exactly ``to_json`` of the
    table returned; anything else (escapes, other spacing, a key twice, another order of
    groups, any bad value) is left to the strict reader.
    """
    if type(text) is bytes and text.isascii():
        text = text.decode("ascii")
    if type(text) is not str:
        return None
    split = _written_entries(text)
    if split is None:
        return None
    fqns, tails, rest = split
    # JSON escapes a newline inside a string, so the drops begin at the first _DROPPED
    tied_text, _, dropped_text = rest.partition(_DROPPED)
    last = tails[-1]
    layouts: dict[str, SourceLayout] = {}
    try:
        for tail, n in Counter(tails).items():
            obj = _SPLIT[3:] + tail.removesuffix(",")
            layout = _entry("<entry>", _load(obj), "entries")
            # every entry but the last ends with a comma; each as to_json writes it
            if (
                tail.endswith(",") == (tail == last)
                or (tail == last and n > 1)
                or json.dumps(_layout_obj(layout)) != obj
            ):
                return None
            layouts[tail] = layout
        entries = CheckedEntries(zip(fqns, map(layouts.__getitem__, tails), strict=True))
        if len(entries) != len(fqns):  # an FQN twice
            return None
        del fqns, tails
        groups = _tied_groups(_load(tied_text), "tied", entries)
        drops = _drops(_load(dropped_text), "dropped") if dropped_text else []
        table = ParamLayoutTable(entries, tied=groups, dropped=drops)
    except LayoutError:
        return None
    return table if _written_tail(table) == rest else None


def _written_tail(table: ParamLayoutTable) -> str:
    """What ``to_json`` writes after the table's entries (``_TIED``) but the last ``}``."""
    text = json.dumps([sorted(g) for g in table.tied])
    if table.dropped:
        drops = _spread_list(list(map(_drop_obj, table.dropped)), 1, json.dumps)
        text = f"{text}{_DROPPED}{drops}"
    return text


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
    return _lay_out(_plan_obj(_checked(plan, ShardingPlan, "plan_to_json")), _PLAN_SPREAD)


def plan_from_json(text: str | bytes) -> ShardingPlan:
    """The plan a version-1 JSON document describes.

    Raises:
        SerializationError: the text is not such a document, with the path of the first
            bad value.
    """
    return _plan(_load(text))


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
    return _lay_out(_shapes_obj(items), _SHAPES_SPREAD)


def shapes_from_json(text: str | bytes) -> Mapping[str, ParamShape]:
    """The parameter shapes a version-1 ``shapes.json`` gives, by FQN in document order.

    Raises:
        SerializationError: the text is not such a document, with the path of the first
            bad value.
    """
    return _shapes(_load(text))


# ---------------------------------------------------------------------------------------
# the converter


def _structure_kind(kind: type[_T]) -> Callable[[Any, Any], _T]:
    def structure(value: object, _: object) -> _T:
        placement = _placement(value, "")
        if not isinstance(placement, kind):
            raise _fail("", f"expected a {kind.__name__} placement", value)
        return placement

    return structure


def configure_converter(converter: _C) -> _C:
    """Register the hooks of every value type of the package on ``converter``.

    After it, ``converter.unstructure(table)`` gives the JSON-ready document and
    ``converter.structure(obj, ParamLayoutTable)`` reads one back strictly (the same for
    ``ShardingPlan``, ``ModulePlan``, ``SourceLayout``, ``ParamShape``, ``AxisName``,
    ``Placement`` and every placement kind), also where they sit inside the user's own
    attrs classes (``dict[str, ParamShape]`` is a ``shapes.json``'s ``params``).

    Returns:
        ``converter`` itself.
    """
    for kind in (Shard, Replicate, Partial, StridedShard):
        converter.register_unstructure_hook(kind, format_placement)
        converter.register_structure_hook(kind, _structure_kind(kind))
    converter.register_structure_hook_func(lambda t: t == Placement, lambda v, _: _placement(v, ""))
    converter.register_unstructure_hook(AxisName, str)
    converter.register_structure_hook(AxisName, lambda v, _: _axis(v, ""))
    converter.register_unstructure_hook(SourceLayout, _layout_obj)
    converter.register_structure_hook(SourceLayout, lambda v, _: _layout(v, ""))
    converter.register_unstructure_hook(ParamLayoutTable, _table_obj)
    converter.register_structure_hook(ParamLayoutTable, lambda v, _: _table(v))
    converter.register_unstructure_hook(ModulePlan, _module_obj)
    converter.register_structure_hook(ModulePlan, lambda v, _: _module(v, ""))
    converter.register_unstructure_hook(Mesh, _mesh_obj)
    converter.register_structure_hook(Mesh, lambda v, _: _mesh(v, ""))
    converter.register_unstructure_hook(ParamShape, _shape_obj)
    converter.register_structure_hook(ParamShape, lambda v, _: _param_shape(v, ""))
    converter.register_unstructure_hook(ShardingPlan, _plan_obj)
    converter.register_structure_hook(ShardingPlan, lambda v, _: _plan(v))
    return converter


def _noted(path: str, error: BaseException) -> str:
    """``path`` followed down to ``error`` by the note cattrs put on it (the index or key
    of an item, the name of an attribute), if any."""
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, IterableValidationNote):
            at = note.index
            if type(at) is int:
                return _index(path, at)
            return f"{path}[{json.dumps(clip(at)) if isinstance(at, str) else quote(at)}]"
        if isinstance(note, AttributeValidationNote):
            return _field(path, clip(note.name))
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
        where = path + inner_path if joined else _field(path, inner_path)
        what = leaf.message.removeprefix(f"{leaf.path}: ")
        shown = _shown(where)
        return SerializationError(f"{shown}: {what}", path=shown, fqn=leaf.fqn), None
    if isinstance(leaf, LayoutError):
        error = SerializationError(f"{_shown(path)}: {leaf.message}", path=_shown(path))
        return error, None
    what = f"could not be structured: {quote(leaf)}"
    return SerializationError(f"{_shown(path)}: {what}", path=_shown(path)), leaf


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
