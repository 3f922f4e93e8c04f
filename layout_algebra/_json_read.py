"""Reading the JSON documents strictly: every value checked, every error at its path.

An unknown key, a duplicate key, a key that is not a string, a wrong type, a bad
placement or axis, NaN or Infinity, or a table or plan that breaks its invariants raises
``SerializationError`` with the JSON path of the bad value
(``entries["layers.7.w"].placements[0]``); messages quote at most a few hundred
characters of it. Nothing in the input names a class, and nothing is executed or
imported from it. Each ``read_*`` function reads one value from its unstructured object
(as ``json.loads`` gives it, or a Python object handed to the converter), given the path
of that object in its document (``""`` for the document itself).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final, TypeVar, cast

from layout_algebra._frozen import FrozenMap
from layout_algebra._json_write import FINGERPRINT, FORMAT_VERSION
from layout_algebra._text import MAX_QUOTED, clip, quote
from layout_algebra.axes import AxisName, as_axis
from layout_algebra.errors import LayoutError, PlacementSyntaxError, SerializationError
from layout_algebra.layout import (
    CheckedEntries,
    Drop,
    ParamLayoutTable,
    SourceLayout,
    check_no_partial,
    interned,
)
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Partial, Placement, parse_placement
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import (
    Packed,
    Part,
    packed_from_obj,
    part_from_obj,
    structure_from_obj,
)

__all__ = [
    "at_field",
    "at_index",
    "at_key",
    "fail",
    "load",
    "read_axis",
    "read_layout",
    "read_mesh",
    "read_module",
    "read_object",
    "read_packed",
    "read_param_shape",
    "read_part",
    "read_placement",
    "read_plan",
    "read_shapes",
    "read_table",
    "shown",
]

_T = TypeVar("_T")
_LAYOUT_ORDER: Final = ("mesh", "axes", "placements")
_LAYOUT_KEYS: Final = frozenset(_LAYOUT_ORDER)
_TABLE_KEYS: Final = frozenset({"version", "entries"})
_TABLE_OPTIONAL: Final = frozenset({"tied", "dropped", FINGERPRINT})
_DROP_KEYS: Final = frozenset({"fqn", "mesh", "axis", "placement"})
_PLAN_KEYS: Final = frozenset({"version", "mesh_axes", "modules"})
_PLAN_OPTIONAL: Final = frozenset({"tied_pairs"})
_MODULE_KEYS: Final = frozenset({"params"})
_MODULE_OPTIONAL: Final = frozenset({"expert_parallel"})
_SHAPES_KEYS: Final = frozenset({"version", "params"})
_SHAPE_KEYS: Final = frozenset({"shape", "dtype"})
_SHAPE_OPTIONAL: Final = frozenset({"structure"})
_TWICE: Final = "key {!r} appears twice in one JSON object; give each key once"


# ---------------------------------------------------------------------------------------
# paths and checked access


def at_key(path: str, key: str) -> str:
    """The path of an object's item by its key (``entries["layers.7.w"]``)."""
    return f"{path}[{json.dumps(clip(key))}]" if path else clip(key)


def at_field(path: str, name: str) -> str:
    """The path of a document's field (``entries["w"].mesh``)."""
    return f"{path}.{name}" if path else name


def at_index(path: str, i: int) -> str:
    """The path of an array's item (``placements[0]``)."""
    return f"{path}[{i}]"


def shown(path: str) -> str:
    """A path as messages show it: ``$`` for the document itself."""
    return path or "$"


def fail(path: str, what: str, value: object, fqn: str | None = None) -> SerializationError:
    """The error for ``value`` at ``path``: ``what`` was expected or is wrong."""
    # a document's arrays and objects (tuples: see ``load``) as JSON shows them
    if isinstance(value, list | tuple):
        got = _Shown().repr(value)  # its first values: cut, with no length to give
        got = got if len(got) <= MAX_QUOTED else f"{got[:MAX_QUOTED]}..."
    else:
        got = quote(value)
    msg = f"{shown(path)}: {what}, got {got}"
    return SerializationError(msg, path=shown(path), fqn=None if fqn is None else clip(fqn))


def _string_keys(value: dict[object, object], path: str) -> None:
    """JSON text always has string keys; a Python object handed to the converter may not."""
    for k in value:
        if type(k) is not str:
            raise _not_text(k, path)


def _not_text(key: object, path: str) -> SerializationError:
    """The error for an object's key that is no string, at its path."""
    where = f"{path}[{quote(key)}]" if path else quote(key)
    return fail(where, "keys are strings (FQNs, paths, axis names)", key)


def _fields(value: object, path: str, at: Callable[[str, str], str]) -> dict[str, object] | None:
    """A JSON object's values by key, ``None`` if ``value`` is no object: the tuple of its
    pairs ``load`` gives, or a dict (a Python object handed to the converter). A key given
    twice would silently drop a value: it is refused, at ``at(path, key)``."""
    if type(value) is tuple:
        if not _pairs(value):  # a Python tuple that spells no object
            return None
        fields = dict(value)
        if len(fields) != len(value):
            _once(value, path, at)
        return fields
    if isinstance(value, dict):
        _string_keys(value, path)
        return value
    return None


def _pairs(value: tuple[object, ...]) -> bool:
    """Whether ``value`` is (key, value) pairs with string keys, as ``load`` gives an object."""
    return all(type(p) is tuple and len(p) == 2 and type(p[0]) is str for p in value)


def _once(pairs: Iterable[tuple[str, object]], path: str, at: Callable[[str, str], str]) -> None:
    """The error at the first key of ``pairs`` given a second time, if one is."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise fail(at(path, key), _TWICE.format(clip(key)), key)
        seen.add(key)


def _object(
    value: object, path: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, object]:
    doc = _fields(value, path, at_field)
    if doc is None:
        raise fail(path, "expected a JSON object", value)
    keys = doc.keys()
    missing = required - keys
    if missing:
        name = sorted(missing)[0]
        raise fail(at_field(path, name), f"missing field {name!r}", value)
    extra = keys - required - optional
    if extra:
        name = sorted(extra)[0]
        allowed = ", ".join(sorted(required | optional))
        where = at_field(path, clip(name))
        raise fail(where, f"unknown field {clip(name)!r} (allowed: {allowed})", doc[name])
    return doc


def read_object(
    value: object, path: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, object]:
    """A JSON object's fields (``load``'s pairs or a dict), each of ``required`` given and
    none outside ``optional`` besides, a key given twice refused; else the error at its
    path. For the readers of values kept in their own modules."""
    return _object(value, path, required, optional)


def _mapping(value: object, path: str, what: str) -> dict[str, object]:
    """A JSON object of any keys (``what`` says of which), or the error at ``path``."""
    fields = _fields(value, path, at_key)
    if fields is None:
        raise fail(path, f"expected a JSON object of {what}", value)
    return fields


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise fail(path, "expected a JSON array", value)
    return value


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise fail(path, "expected a string", value)
    return value


def _fqn(value: object, path: str) -> str:
    fqn = _str(value, path)
    if not fqn:
        raise fail(path, "a parameter FQN must be non-empty", fqn)
    return fqn


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise fail(path, "expected true or false", value)
    return value


def _version(doc: dict[str, object], path: str = "") -> None:
    v = doc["version"]
    if type(v) is not int or v != FORMAT_VERSION:
        raise fail(
            at_field(path, "version"), f"unsupported version (this reads {FORMAT_VERSION})", v
        )


def read_placement(value: object, path: str) -> Placement:
    text = _str(value, path)
    try:
        return parse_placement(text)
    except PlacementSyntaxError as e:
        raise fail(path, e.message, value) from None


def read_axis(value: object, path: str) -> AxisName:
    name = _str(value, path)
    try:
        return as_axis(name)
    except LayoutError as e:
        raise fail(path, e.message, value) from None


def _named_key(keys: Iterable[str], named: str | None) -> str | None:
    """The key an error's ``.fqn`` names (errors show long keys clipped), if any."""
    if named is None:
        return None
    return next((k for k in keys if k == named or clip(k) == named), None)


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
        where = shown(locate(e) or path)
        msg = f"{where}: {e.message}"
        named = fqn if fqn is not None else e.fqn
        raise SerializationError(msg, path=where, fqn=named) from None


def _fails(build: Callable[[], object]) -> bool:
    try:
        build()
    except LayoutError:
        return True
    return False


# ---------------------------------------------------------------------------------------
# tables


def read_layout(value: object, path: str) -> SourceLayout:
    doc = _object(value, path, _LAYOUT_KEYS)
    mesh = _str(doc["mesh"], at_field(path, "mesh"))
    axes_path, placements_path = at_field(path, "axes"), at_field(path, "placements")
    axes = [
        read_axis(a, at_index(axes_path, i)) for i, a in enumerate(_list(doc["axes"], axes_path))
    ]
    placements = [
        read_placement(p, at_index(placements_path, i))
        for i, p in enumerate(_list(doc["placements"], placements_path))
    ]

    def locate(e: LayoutError) -> str | None:
        if len(axes) != len(placements):
            return placements_path
        repeat = _repeat([a.name for a in axes], e.axis)
        if repeat is not None:
            return at_index(axes_path, repeat)
        if _fails(lambda: SourceLayout(mesh, (), ())):
            return at_field(path, "mesh")
        return None

    return _wrap(path, lambda: SourceLayout(mesh, axes, placements), locate)


def _entry(fqn: str, raw: object, where: str) -> SourceLayout:
    """One table entry: a layout with no ``Partial``, as the one object tables hold for
    it (so the table takes the entries as they are)."""
    layout = read_layout(raw, where)
    for i, p in enumerate(layout.placements):
        if isinstance(p, Partial):
            path = at_index(at_field(where, "placements"), i)
            _wrap(path, lambda: check_no_partial(fqn, layout), fqn=fqn)
    return interned(layout)


def _entries(value: object, path: str) -> CheckedEntries:
    """A table's entries, each FQN non-empty and given once, each layout interned with
    no ``Partial`` (so the table takes them as they are). The keys are checked before the
    values: a bad key is the error even where a value before it is bad too.

    Equal layouts are spelled alike: each spelling is read once and its value shared. A
    spelling is one tuple of the layout object's keys in order, its mesh, the number of
    its axes, its axes and its placements; it is remembered only once read in full, so
    it then holds strings and that count only and equals no spelling of anything else.
    """
    items: Collection[tuple[str, object]]
    if type(value) is tuple:  # load's pairs (a Python tuple that holds none is refused)
        items = value
    elif isinstance(value, dict):  # a Python object handed to the converter
        _string_keys(value, path)
        items = value.items()
    else:
        raise fail(path, "expected a JSON object of FQN -> layout", value)
    entries = CheckedEntries()
    read: dict[tuple[object, ...], SourceLayout] = {}
    try:
        for fqn, raw in items:
            if type(fqn) is not str:
                _check_keys(items, path)
            layout = spelling = None
            pairs = raw
            if type(raw) is dict and raw.keys() == _LAYOUT_KEYS:  # spelled as load's would be
                pairs = tuple(raw.items())
            if type(pairs) is tuple:
                try:  # three pairs (the count is checked by unpacking them)
                    (k1, mesh), (k2, axes), (k3, placements) = pairs
                    if type(axes) is list and type(placements) is list:
                        # one tuple, not one per list: the count marks where placements begin
                        spelling = (k1, k2, k3, mesh, len(axes), *axes, *placements)
                        layout = read.get(spelling)
                except (TypeError, ValueError):  # no pairs, or arrays or objects inside
                    spelling = None  # the full read reports it
            if layout is None:
                try:
                    layout = _entry(fqn, raw, at_key(path, fqn))
                except SerializationError:
                    _check_keys(items, path)
                    raise
                if spelling is not None:
                    read[spelling] = layout
            entries[fqn] = layout
    except (TypeError, ValueError) as e:  # an item that is no pair (a Python tuple's)
        if isinstance(e, LayoutError):
            raise
        _check_keys(items, path)
        raise
    if len(entries) != len(items) or "" in entries:
        _check_keys(items, path)
    return entries


def _check_keys(items: Collection[object], path: str) -> None:
    """The items of a table's entries each a pair of a non-empty FQN given once and its
    value, or the error at the first that is not."""
    for item in items:
        if type(item) is not tuple or len(item) != 2:
            raise fail(path, "expected a JSON object of FQN -> layout", items)
        fqn = item[0]
        if type(fqn) is not str:
            raise _not_text(fqn, path)
        if not fqn:
            raise fail(at_key(path, fqn), "a parameter FQN must be non-empty", fqn)
    _once(cast("Collection[tuple[str, object]]", items), path, at_key)


def _tied_groups(value: object, path: str, entries: Mapping[str, SourceLayout]) -> list[list[str]]:
    groups: list[list[str]] = []
    for i, raw_group in enumerate(_list(value, path)):
        group_path = at_index(path, i)
        members = [
            _fqn(m, at_index(group_path, j)) for j, m in enumerate(_list(raw_group, group_path))
        ]
        for j, m in enumerate(members):
            if m not in entries:
                raise fail(at_index(group_path, j), "tied member has no entry in the table", m, m)
        groups.append(members)
    return groups


def _drop(value: object, path: str) -> Drop:
    doc = _object(value, path, _DROP_KEYS)
    fqn = _fqn(doc["fqn"], at_field(path, "fqn"))
    mesh = _str(doc["mesh"], at_field(path, "mesh"))
    axis = read_axis(doc["axis"], at_field(path, "axis"))
    placement = read_placement(doc["placement"], at_field(path, "placement"))
    # the FQN, axis and placement are checked: only the mesh role can be bad
    return _wrap(at_field(path, "mesh"), lambda: Drop(fqn, mesh, axis, placement), fqn=fqn)


def _drops(value: object, path: str) -> list[Drop]:
    """The drops of a table document (``build_table`` drops one kind of placement on many
    parameters: each spelling of mesh, axis and placement is read once)."""
    out: list[Drop] = []
    read: dict[tuple[object, ...], Drop] = {}
    for i, raw in enumerate(_list(value, path)):
        where = at_index(path, i)
        fields = _fields(raw, where, at_field)
        spelling = None
        if fields is not None and fields.keys() == _DROP_KEYS:
            fqn, mesh, axis, placement = (fields[k] for k in ("fqn", "mesh", "axis", "placement"))
            if type(mesh) is str and type(axis) is str and type(placement) is str:
                spelling = (mesh, axis, placement)
                known = read.get(spelling)
                if known is not None and type(fqn) is str and fqn:
                    out.append(Drop(fqn, known.mesh, known.axis, known.placement))
                    continue
        drop = _drop(raw, where)
        if spelling is not None:
            read[spelling] = drop
        out.append(drop)
    return out


def _check_fingerprint(table: ParamLayoutTable, value: object, path: str) -> None:
    """A document's fingerprint must be the one of what was read from it."""
    written = _str(value, path)
    content = table.fingerprint()
    if written == content:
        return
    version, colon, _ = written.partition(":")
    if colon and version != content.partition(":")[0]:
        # a digest of another version differs whatever the content: say so, claim no edit
        msg = (
            f"{shown(path)}: the document's fingerprint {quote(written)} is of another "
            f"version than the one this package computes ({content!r}), so the content "
            f'cannot be checked; delete the "{FINGERPRINT}" field to read it unchecked'
        )
    else:
        msg = (
            f"{shown(path)}: the document's fingerprint {quote(written)} differs from "
            f"{content!r}, the fingerprint of the table it holds: the file was changed after "
            f'it was written; delete the "{FINGERPRINT}" field to accept the edit'
        )
    raise SerializationError(msg, path=shown(path))


def read_table(value: object, path: str = "") -> ParamLayoutTable:
    doc = _object(value, path, _TABLE_KEYS, _TABLE_OPTIONAL)
    _version(doc, path)
    entries = _entries(doc["entries"], at_field(path, "entries"))
    tied_path = at_field(path, "tied")
    groups = _tied_groups(doc.get("tied", []), tied_path, entries)
    drops = _drops(doc.get("dropped", []), at_field(path, "dropped"))

    def locate(e: LayoutError) -> str | None:
        # a member in two groups, at its second; else the first group bad on its own
        holding = [i for i, group in enumerate(groups) if e.fqn in group]
        if len(holding) > 1:
            i = holding[1]
            return at_index(at_index(tied_path, i), groups[i].index(str(e.fqn)))
        for i, group in enumerate(groups):
            alone = {m: entries[m] for m in group}
            if _fails(lambda: ParamLayoutTable(alone, tied=[group])):  # noqa: B023
                return at_index(tied_path, i)
        return tied_path if groups else None

    table = _wrap(path, lambda: ParamLayoutTable(entries, tied=groups, dropped=drops), locate)
    if FINGERPRINT in doc:
        _check_fingerprint(table, doc[FINGERPRINT], at_field(path, FINGERPRINT))
    return table


# ---------------------------------------------------------------------------------------
# plans


def _named(value: object, path: str) -> dict[str, Placement]:
    out: dict[str, Placement] = {}
    for axis, p in _mapping(value, path, "axis -> placement").items():
        where = at_key(path, axis)
        out[read_axis(axis, where).name] = read_placement(p, where)
    return out


def read_module(value: object, path: str) -> ModulePlan:
    doc = _object(value, path, _MODULE_KEYS, _MODULE_OPTIONAL)
    params_path = at_field(path, "params")
    raw_params = _mapping(doc["params"], params_path, "parameter path -> placements")
    params = {name: _named(named, at_key(params_path, name)) for name, named in raw_params.items()}
    expert = _bool(doc.get("expert_parallel", False), at_field(path, "expert_parallel"))

    def locate(e: LayoutError) -> str | None:
        name = _named_key(params, e.fqn)
        if name is None:
            return None
        where = at_key(params_path, name)
        return at_key(where, e.axis) if e.axis in params[name] else where

    return _wrap(path, lambda: ModulePlan(params, expert_parallel=expert), locate)


def read_plan(value: object, path: str = "") -> ShardingPlan:
    doc = _object(value, path, _PLAN_KEYS, _PLAN_OPTIONAL)
    _version(doc, path)
    axes_path = at_field(path, "mesh_axes")
    mesh_axes = [
        read_axis(a, at_index(axes_path, i))
        for i, a in enumerate(_list(doc["mesh_axes"], axes_path))
    ]
    modules_path = at_field(path, "modules")
    raw_modules = _mapping(doc["modules"], modules_path, "module FQN -> module plan")
    modules = {
        name: read_module(spec, at_key(modules_path, name)) for name, spec in raw_modules.items()
    }
    pairs_path = at_field(path, "tied_pairs")
    pairs: list[tuple[str, str]] = []
    for i, raw_pair in enumerate(_list(doc.get("tied_pairs", []), pairs_path)):
        pair_path = at_index(pairs_path, i)
        pair = _list(raw_pair, pair_path)
        if len(pair) != 2:
            raise fail(pair_path, "a tied pair is an array of two FQNs", pair)
        pairs.append((_fqn(pair[0], at_index(pair_path, 0)), _fqn(pair[1], at_index(pair_path, 1))))

    def locate(e: LayoutError) -> str | None:
        repeat = _repeat([a.name for a in mesh_axes], e.axis)
        if repeat is not None:
            return at_index(axes_path, repeat)
        name = _named_key(modules, e.fqn)
        return None if name is None else at_key(modules_path, name)

    return _wrap(path, lambda: ShardingPlan(modules, mesh_axes=mesh_axes, tied_pairs=pairs), locate)


# ---------------------------------------------------------------------------------------
# meshes and shapes


def read_mesh(value: object, path: str) -> Mesh:
    """A ``Mesh`` from its JSON object: axis name to size, in mesh order."""
    sizes = _fields(value, path, at_key)
    if sizes is None:
        raise fail(
            path, 'expected a mesh: an object of axis name to size, such as {"tp": 4}', value
        )
    for name, size in sizes.items():
        if type(size) is not int:
            raise fail(at_key(path, name), "expected a mesh size (an int >= 1)", size)

    def locate(e: LayoutError) -> str | None:
        return None if e.axis is None or e.axis not in sizes else at_key(path, e.axis)

    return _wrap(path, lambda: Mesh(cast("dict[str, int]", sizes)), locate)


def read_param_shape(value: object, path: str) -> ParamShape:
    doc = _object(value, path, _SHAPE_KEYS, _SHAPE_OPTIONAL)
    shape_path, dtype_path = at_field(path, "shape"), at_field(path, "dtype")
    sizes = cast("list[int]", _list(doc["shape"], shape_path))
    for i, n in enumerate(sizes):
        if type(n) is not int:
            raise fail(at_index(shape_path, i), "expected a size (an int >= 0)", n)
    dtype = _str(doc["dtype"], dtype_path)
    structure_path = at_field(path, "structure")
    structure = (
        structure_from_obj(_plain(doc["structure"], structure_path), structure_path)
        if "structure" in doc
        else {}
    )

    def locate(_: LayoutError) -> str | None:
        if _fails(lambda: ParamShape((), dtype)):
            return dtype_path
        for i, n in enumerate(sizes):
            if _fails(lambda: ParamShape((n,), "float32")):  # noqa: B023 (called at once)
                return at_index(shape_path, i)
        if not _fails(lambda: ParamShape(sizes, dtype)):
            return structure_path  # a structure that does not fit the shape
        return shape_path

    return _wrap(path, lambda: ParamShape(sizes, dtype, structure=structure), locate)


def read_part(value: object, path: str) -> Part:
    """A ``Part`` from its JSON object, by the rules of a ``shapes.json`` structure's parts."""
    return part_from_obj(_plain(value, path), path)


def read_packed(value: object, path: str) -> Packed:
    """A ``Packed`` from its JSON array of parts, as a ``shapes.json`` structure holds it."""
    return packed_from_obj(_plain(value, path), path)


def plain_data(value: object, path: str = "") -> object:
    """``value`` with each JSON object in it (``load``'s pairs) a dict, a key given twice
    refused at its path: for the readers of values kept in their own modules that read
    plain JSON data."""
    return _plain(value, path)


def _plain(value: object, path: str) -> object:
    """``value`` with each JSON object in it a dict, for a reader of plain JSON data."""
    fields = _fields(value, path, at_key)
    if fields is not None:
        return {key: _plain(v, at_key(path, key)) for key, v in fields.items()}
    if isinstance(value, list):
        return [_plain(v, at_index(path, i)) for i, v in enumerate(value)]
    return value


def read_shapes(value: object, path: str = "") -> FrozenMap[str, ParamShape]:
    doc = _object(value, path, _SHAPES_KEYS)
    _version(doc, path)
    params_path = at_field(path, "params")
    raw = _mapping(doc["params"], params_path, "FQN -> shape and dtype")
    # Models repeat a few shapes: read each spelling once. Only spellings of ints are
    # remembered (true and 1.0 equal 1, but are no size).
    read: dict[tuple[object, ...], ParamShape] = {}
    out: dict[str, ParamShape] = {}
    for fqn, spec in raw.items():
        where = at_key(params_path, fqn)
        if not fqn:
            raise fail(where, "a parameter FQN must be non-empty", fqn)
        fields = _fields(spec, where, at_field)
        spelling: tuple[object, ...] | None = None
        if (
            fields is not None
            and fields.keys() == _SHAPE_KEYS
            and type(fields["dtype"]) is str
            and type(fields["shape"]) is list
            and all(type(n) is int for n in fields["shape"])
        ):
            spelling = (fields["dtype"], *fields["shape"])
        shape = read.get(spelling) if spelling is not None else None
        if shape is None:
            shape = read_param_shape(spec, where)
            if spelling is not None:
                read[spelling] = shape
        out[fqn] = shape
    return FrozenMap(out)


# ---------------------------------------------------------------------------------------
# text


class _Shown(reprlib.Repr):
    """How a message shows a value read from JSON: objects as dicts in their order, a few
    levels deep (however deep the document nests), and only the first values of it, so a
    list shared many times over (``x = [x] * 16``, eight deep) is shown at once."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 8
        self.maxstring = self.maxlong = self.maxother = MAX_QUOTED
        self.maxdict = self.maxlist = 16
        self.left = MAX_QUOTED  # values still shown: each shows as a character or more

    def repr1(self, x: object, level: int) -> str:
        self.left -= 1
        return super().repr1(x, level) if self.left >= 0 else self.fillvalue

    def repr_instance(self, x: object, level: int) -> str:
        return quote(x, self.maxother)  # a big int, or a container of another type

    repr_int = repr_instance

    def repr_tuple(self, value: tuple[object, ...], level: int) -> str:
        if not all(type(p) is tuple and len(p) == 2 for p in value):
            return super().repr_tuple(value, level)  # a Python tuple, not an object of ``load``
        if not value:
            return "{}"
        if level <= 0:
            return "{...}"
        pairs = cast("tuple[tuple[object, object], ...]", value)
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in pairs]
        return (
            "{"
            + ", ".join(items[: self.maxdict])
            + (", ...}" if len(items) > self.maxdict else "}")
        )


class _NonFinite(Exception):
    pass


def _reject_constant(name: str) -> object:
    raise _NonFinite(name)


def load(text: str | bytes) -> object:
    """The JSON value of ``text``, each object as the tuple of its (key, value) pairs in
    order, so that a key given twice is seen (JSON arrays are lists: a tuple is always an
    object); no NaN or Infinity."""
    if not isinstance(text, str | bytes | bytearray):
        raise fail("", "expected JSON text", text)
    try:
        return json.loads(text, object_pairs_hook=tuple, parse_constant=_reject_constant)
    except _NonFinite as e:
        raise fail("", "NaN and Infinity are not JSON", str(e)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise fail("", f"not valid JSON ({clip(str(e))})", text[:40]) from None
