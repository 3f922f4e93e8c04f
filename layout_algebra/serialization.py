"""Versioned JSON for tables and plans, through one configured cattrs converter.

The documents are meant to be read by people: placements in the DSL (``"S(0)"``), one
table entry per line::

    {"version": 1,
     "entries": {
      "emb.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]}
     },
     "tied": [["emb.weight", "head.weight"]]}

Reading is strict: an unknown key, a duplicate key, a wrong type, a bad placement or
axis, or a table that breaks its invariants raises ``SerializationError`` with the JSON
path of the first bad value (``entries["layers.7.w"].placements[0]``). Nothing in the
input names a class, and nothing is executed or imported from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any, Final, TypeVar, cast

import cattrs

from layout_algebra.axes import AxisName, as_axis
from layout_algebra.errors import LayoutError, PlacementSyntaxError, SerializationError
from layout_algebra.layout import ParamLayoutTable, SourceLayout, check_no_partial
from layout_algebra.layout import _CheckedEntries as CheckedEntries
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

__all__ = [
    "FORMAT_VERSION",
    "converter",
    "from_json",
    "plan_from_json",
    "plan_to_json",
    "to_json",
]

FORMAT_VERSION: Final = 1
"""The version written into, and required of, every document."""

_T = TypeVar("_T")
_LAYOUT_KEYS: Final = frozenset({"mesh", "axes", "placements"})


# ---------------------------------------------------------------------------------------
# paths and checked access


def _key(path: str, key: str) -> str:
    return f"{path}[{json.dumps(key)}]" if path else f"{key}"


def _field(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _shown(path: str) -> str:
    return path or "$"


def _fail(path: str, what: str, value: object, fqn: str | None = None) -> SerializationError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    msg = f"{_shown(path)}: {what}, got {shown}"
    return SerializationError(msg, path=_shown(path), fqn=fqn)


def _object(
    value: object, path: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, object]:
    _check_unique(value, path, _field)
    if not isinstance(value, dict):
        raise _fail(path, "expected a JSON object", value)
    keys = value.keys()
    missing = required - keys
    if missing:
        name = sorted(missing)[0]
        raise _fail(_field(path, name), f"missing field {name!r}", value)
    extra = keys - required - optional
    if extra:
        name = sorted(extra)[0]
        allowed = ", ".join(sorted(required | optional))
        raise _fail(_field(path, name), f"unknown field {name!r} (allowed: {allowed})", value[name])
    return value


def _mapping(value: object, path: str, what: str) -> dict[str, object]:
    """A JSON object of any keys (``what`` says of which), or the error at ``path``."""
    _check_unique(value, path, _key)
    if not isinstance(value, dict):
        raise _fail(path, f"expected a JSON object of {what}", value)
    return value


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise _fail(path, "expected a JSON array", value)
    return value


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, "expected a string", value)
    return value


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


def _wrap(path: str, build: Callable[[], _T], fqn: str | None = None) -> _T:
    """``build()``, its ``LayoutError`` turned into a ``SerializationError`` at ``path``."""
    try:
        return build()
    except SerializationError:
        raise
    except LayoutError as e:
        msg = f"{_shown(path)}: {e.message}"
        raise SerializationError(msg, path=_shown(path), fqn=fqn) from None


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
    return _wrap(path, lambda: SourceLayout(mesh, axes, placements))


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


def _table(value: object, path: str = "") -> ParamLayoutTable:
    doc = _object(value, path, frozenset({"version", "entries"}), frozenset({"tied"}))
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
    groups: list[frozenset[str]] = []
    for i, raw_group in enumerate(_list(doc.get("tied", []), tied_path)):
        group_path = _index(tied_path, i)
        members = [
            _str(m, _index(group_path, j)) for j, m in enumerate(_list(raw_group, group_path))
        ]
        for j, m in enumerate(members):
            if m not in entries:
                raise _fail(_index(group_path, j), "tied member has no entry in the table", m, m)
        groups.append(frozenset(members))
    return _wrap(tied_path if groups else path, lambda: ParamLayoutTable(entries, tied=groups))


def _named(value: object, path: str) -> dict[str, Placement]:
    out: dict[str, Placement] = {}
    for axis, p in _mapping(value, path, "axis -> placement").items():
        where = _key(path, axis)
        out[_axis(axis, where).name] = _placement(p, where)
    return out


def _module(value: object, path: str) -> ModulePlan:
    doc = _object(value, path, frozenset({"params"}), frozenset({"expert_parallel"}))
    params_path = _field(path, "params")
    raw_params = _mapping(doc["params"], params_path, "parameter path -> placements")
    params = {name: _named(named, _key(params_path, name)) for name, named in raw_params.items()}
    expert = _bool(doc.get("expert_parallel", False), _field(path, "expert_parallel"))
    return _wrap(path, lambda: ModulePlan(params, expert_parallel=expert))


def _plan(value: object, path: str = "") -> ShardingPlan:
    doc = _object(
        value, path, frozenset({"version", "mesh_axes", "modules"}), frozenset({"tied_pairs"})
    )
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
        pairs.append((_str(pair[0], _index(pair_path, 0)), _str(pair[1], _index(pair_path, 1))))
    return _wrap(path, lambda: ShardingPlan(modules, mesh_axes=mesh_axes, tied_pairs=pairs))


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
        msg = f"key {value.key!r} appears twice in one JSON object; give each key once"
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
        raise _fail("", f"not valid JSON ({e})", text[:40]) from None


# ---------------------------------------------------------------------------------------
# writing


def _layout_obj(layout: SourceLayout) -> dict[str, object]:
    return {
        "mesh": layout.mesh,
        "axes": [a.name for a in layout.axes],
        "placements": [format_placement(p) for p in layout.placements],
    }


def _table_obj(table: ParamLayoutTable) -> dict[str, object]:
    cache: dict[int, dict[str, object]] = {}
    entries: dict[str, object] = {}
    for fqn, layout in table.items():
        obj = cache.get(id(layout))
        if obj is None:
            obj = cache[id(layout)] = _layout_obj(layout)
        entries[fqn] = obj
    return {
        "version": FORMAT_VERSION,
        "entries": entries,
        "tied": [sorted(g) for g in table.tied],
    }


def _plan_obj(plan: ShardingPlan) -> dict[str, object]:
    return {
        "version": FORMAT_VERSION,
        "mesh_axes": [a.name for a in plan.mesh_axes],
        "tied_pairs": [list(p) for p in plan.tied_pairs],
        "modules": {
            name: {
                "params": {
                    path: {axis: format_placement(p) for axis, p in named.items()}
                    for path, named in spec.params.items()
                },
                "expert_parallel": spec.expert_parallel,
            }
            for name, spec in plan.modules.items()
        },
    }


def to_json(table: ParamLayoutTable) -> str:
    """The table as a version-1 JSON document, one entry per line.

    >>> from layout_algebra import Shard
    >>> print(to_json(ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})))
    {"version": 1,
     "entries": {
      "w": {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}
     },
     "tied": []}
    """
    dumps = json.dumps
    quote = encode_basestring_ascii  # what dumps does with a str, without its set-up
    cache: dict[int, str] = {}
    lines: list[str] = []
    append = lines.append
    for fqn, layout in table.items():
        text = cache.get(id(layout))
        if text is None:
            text = cache[id(layout)] = dumps(_layout_obj(layout))
        append(f"  {quote(fqn)}: {text}")
    body = ",\n".join(lines)
    tied = dumps([sorted(g) for g in table.tied])
    entries = f"{{\n{body}\n }}" if lines else "{}"
    return f'{{"version": {FORMAT_VERSION},\n "entries": {entries},\n "tied": {tied}}}'


def from_json(text: str | bytes) -> ParamLayoutTable:
    """The table a version-1 JSON document describes.

    Raises:
        SerializationError: the text is not such a document; the message and ``.path``
            give the JSON path of the first bad value.
    """
    return _table(_load(text))


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
    """
    dumps = json.dumps
    modules: list[str] = []
    for name, spec in plan.modules.items():
        params = ",\n".join(
            f"    {dumps(path)}: {dumps({a: format_placement(p) for a, p in named.items()})}"
            for path, named in spec.params.items()
        )
        head = f'  {dumps(name)}: {{"expert_parallel": {dumps(spec.expert_parallel)}, "params": '
        modules.append(f"{head}{{\n{params}\n  }}}}" if params else f"{head}{{}}}}")
    joined = ",\n".join(modules)
    body = f"{{\n{joined}\n }}" if modules else "{}"
    return (
        f'{{"version": {FORMAT_VERSION},\n'
        f' "mesh_axes": {dumps([a.name for a in plan.mesh_axes])},\n'
        f' "tied_pairs": {dumps([list(p) for p in plan.tied_pairs])},\n'
        f' "modules": {body}}}'
    )


def plan_from_json(text: str | bytes) -> ShardingPlan:
    """The plan a version-1 JSON document describes.

    Raises:
        SerializationError: the text is not such a document, with the path of the first
            bad value.
    """
    return _plan(_load(text))


# ---------------------------------------------------------------------------------------
# the converter


def _make_converter() -> cattrs.Converter:
    c = cattrs.Converter()
    for kind in (Shard, Replicate, Partial, StridedShard):
        c.register_unstructure_hook(kind, format_placement)
        c.register_structure_hook(kind, _structure_kind(kind))
    c.register_unstructure_hook(AxisName, str)
    c.register_structure_hook(AxisName, lambda v, _: _axis(v, ""))
    c.register_unstructure_hook(SourceLayout, _layout_obj)
    c.register_structure_hook(SourceLayout, lambda v, _: _layout(v, ""))
    c.register_unstructure_hook(ParamLayoutTable, _table_obj)
    c.register_structure_hook(ParamLayoutTable, lambda v, _: _table(v))
    c.register_unstructure_hook(ShardingPlan, _plan_obj)
    c.register_structure_hook(ShardingPlan, lambda v, _: _plan(v))
    c.register_structure_hook_func(lambda t: t == Placement, lambda v, _: _placement(v, ""))
    return c


def _structure_kind(kind: type[_T]) -> Callable[[Any, Any], _T]:
    def structure(value: object, _: object) -> _T:
        placement = _placement(value, "")
        if not isinstance(placement, kind):
            raise _fail("", f"expected a {kind.__name__} placement", value)
        return placement

    return structure


converter: Final[cattrs.Converter] = _make_converter()
"""The configured converter: ``converter.unstructure(table)`` gives the JSON-ready
document, ``converter.structure(obj, ParamLayoutTable)`` reads one back (the same for
``ShardingPlan``, ``SourceLayout``, ``AxisName`` and every placement)."""
