"""Source layouts and the table that gives one to every parameter.

A ``SourceLayout`` is a parameter's placements on the non-FSDP axes of one source
sub-mesh; a ``ParamLayoutTable`` maps parameter FQNs to them and records which
parameters share storage (``tied``).
"""

from __future__ import annotations

from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    ValuesView,
)
from itertools import compress, filterfalse, repeat
from operator import add, is_, itemgetter
from typing import ClassVar, Final, TypeVar, overload

import attrs

from layout_algebra._args import as_instances, as_items, mapping_items, plain_str
from layout_algebra._text import clip, escape, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis, check_distinct_axes
from layout_algebra.errors import LayoutError
from layout_algebra._frozen import REQUIRED, DictView, check_init
from layout_algebra.placements import (
    Partial,
    Placement,
    Shard,
    StridedShard,
    format_placement,
    is_placement,
)

__all__ = ["Drop", "ParamLayoutTable", "SourceLayout"]

T = TypeVar("T")


def _as_placements(values: Iterable[Placement]) -> tuple[Placement, ...]:
    raw: object = values
    if is_placement(raw):
        shown = format_placement(values)  # type: ignore[arg-type]  # narrowed at run time
        msg = f"placements must be a sequence, got the single placement {shown}; write ({raw!r},)"
        raise LayoutError(msg, placement=shown)
    placements = as_items(values, "placements", "(Shard(0), Replicate())")
    for p in placements:
        if not is_placement(p):
            msg = (
                f"placements: {quote(p)} is not a placement; use Shard(d), Replicate(), "
                "Partial(op) or StridedShard(d, split_factor=k) (parse_placement reads the DSL)"
            )
            raise LayoutError(msg)
    return placements


def _check_mesh_role(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        msg = f"a layout's mesh role must be a non-empty string such as 'dense', got {quote(value)}"
        raise LayoutError(msg)


@attrs.frozen(cache_hash=True)
class SourceLayout:
    """A parameter's placement on each source axis of one sub-mesh, in mesh order.

    ``mesh`` is the role of the mesh (``"dense"``, ``"expert"``), ``axes`` its source
    axes and ``placements`` one placement per axis. Printed as ``dense[tp=S(0), ep=R]``.
    """

    mesh: str = attrs.field(converter=plain_str, validator=_check_mesh_role, **REQUIRED)
    axes: tuple[AxisName, ...] = attrs.field(converter=as_axes, **REQUIRED)
    placements: tuple[Placement, ...] = attrs.field(converter=_as_placements, **REQUIRED)

    def __attrs_pre_init__(
        self, mesh: str, axes: Iterable[AxisLike], placements: Iterable[Placement]
    ) -> None:
        check_init(self, "mesh", (mesh, axes, placements))

    @placements.validator
    def _check_shape(self, _: attrs.Attribute[tuple[Placement, ...]], value: object) -> None:
        if len(self.axes) != len(self.placements):
            axes = clip(str([a.name for a in self.axes]))
            placements = clip(str([format_placement(p) for p in self.placements]))
            msg = (
                f"{clip(self.mesh)}: {len(self.axes)} axes {axes} but "
                f"{len(self.placements)} placements {placements}; give one placement per axis"
            )
            raise LayoutError(msg)
        check_distinct_axes(self.axes, f"the {clip(self.mesh)} layout")

    def __str__(self) -> str:
        inner = ", ".join(
            f"{a.name}={format_placement(p)}"
            for a, p in zip(self.axes, self.placements, strict=True)
        )
        return f"{self.mesh}[{inner}]"

    def placement_on(self, axis: AxisLike) -> Placement:
        """The placement on ``axis``.

        Raises:
            LayoutError: the layout has no such axis.
        """
        name = as_axis(axis)
        for a, p in zip(self.axes, self.placements, strict=True):
            if a == name:
                return p
        axes = clip(str([a.name for a in self.axes]))
        msg = f"{clip(str(self))} has no axis {clip(name.name)!r}; its axes are {axes}"
        raise LayoutError(msg, axis=name.name)

    def with_placements(self, placements: Iterable[Placement]) -> SourceLayout:
        """This layout with other placements on the same axes."""
        return attrs.evolve(self, placements=placements)

    def with_mesh(self, mesh: str) -> SourceLayout:
        """This layout on the mesh of another role."""
        return attrs.evolve(self, mesh=mesh)

    @property
    def is_replicated(self) -> bool:
        """Whether every placement is ``Replicate`` (also true with no axes)."""
        return not any(isinstance(p, Shard | StridedShard | Partial) for p in self.placements)


class _CheckedEntries(dict[str, SourceLayout]):
    """Entries this package has already validated: the table takes them without a copy.

    Private to the package: the combinators build one, fill it with checked layouts and
    hand it over to exactly one table, keeping no reference; nothing changes it afterwards.
    """

    __slots__ = ()


_Inner = Mapping[str, SourceLayout]


def _plain_key(key: object) -> str | None:
    """A lookup's key other than a plain ``str`` as one (a ``str`` subclass, as the text
    it holds, so its own ``__hash__`` and ``__eq__`` are never called), or ``None`` for
    anything else: no FQN is anything but text."""
    return plain_str(key) if isinstance(key, str) else None


def _lookup_key(key: object) -> str:
    """``table[key]``'s key other than a plain ``str`` as one (``_plain_key``).

    Raises:
        LayoutError: ``key`` is not a ``str``, naming its type.
    """
    fqn = _plain_key(key)
    if fqn is None:
        msg = (
            f"a table is looked up by parameter FQN (a str such as 'wq.weight'), got "
            f"{type(key).__name__} {quote(key)}"
        )
        raise LayoutError(msg)
    return fqn


def _lacked(fqns: Sequence[str], spelled: Iterable[Iterable[str]]) -> list[str]:
    """Each of ``fqns`` (once, in the order given) that none of ``spelled`` holds: every
    spelled FQN struck from their set at C speed, what is left read back in order."""
    wanted = set(fqns)
    for names in spelled:
        if not wanted:
            break
        wanted.difference_update(names)
    return list(dict.fromkeys(filter(wanted.__contains__, fqns))) if wanted else []


class _Kept(Mapping[str, SourceLayout]):
    """Checked entries kept apart from a dict by FQN: every lookup is ``_find``, and the
    items and values are the views the subclass names."""

    __slots__ = ()
    _items_view: ClassVar[type[ItemsView[str, SourceLayout]]]
    _values_view: ClassVar[type[ValuesView[SourceLayout]]]

    def items(self) -> ItemsView[str, SourceLayout]:
        return self._items_view(self)

    def values(self) -> ValuesView[SourceLayout]:
        return self._values_view(self)

    def _find(self, fqn: object) -> SourceLayout | None:
        """The layout of ``fqn``, or ``None`` (for anything but a ``str`` too)."""
        raise NotImplementedError

    def __getitem__(self, fqn: str) -> SourceLayout:
        if type(fqn) is not str:
            fqn = _lookup_key(fqn)
        layout = self._find(fqn)
        if layout is None:
            raise KeyError(fqn)
        return layout

    def __contains__(self, fqn: object) -> bool:
        return self._find(fqn) is not None

    @overload
    def get(self, fqn: str, /) -> SourceLayout | None: ...
    @overload
    def get(self, fqn: str, /, default: SourceLayout) -> SourceLayout: ...
    @overload
    def get(self, fqn: str, /, default: T) -> SourceLayout | T: ...
    def get(self, fqn: str, /, default: object = None) -> object:
        layout = self._find(fqn)
        return default if layout is None else layout

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class ByModule(_Kept):
    """Checked entries kept by module: each module FQN's key object, and the inner map
    ``{param path: layout}`` of each distinct key object.

    The read-only mapping from parameter FQN (``f"{module}.{path}"``, just ``path`` for the
    root module) that a table holds when ``build_table`` made it from a plan without
    patterns. ``modules`` is the plan's own dict of module plans (never changed: the plan
    is frozen), and ``inner_of`` maps the id of each distinct module plan to it and its
    layouts (each entry holds the object its id is of). The modules of a model are of a
    few kinds, so a table of a million parameters holds a few inner maps, and no FQN
    string is spelled until asked for. Iteration is in plan order. Private to the
    package, like ``_CheckedEntries``: built only from checked layouts and distinct FQNs
    (no module's FQN and path spell another's), and never changed.
    """

    __slots__ = ("_inner_of", "_len", "_modules")
    _modules: Mapping[str, object]
    _inner_of: Mapping[int, tuple[object, Mapping[str, SourceLayout]]]
    _len: int | None
    """The number of entries, counted when first asked for (a pass over the modules)."""

    def __init__(
        self,
        modules: Mapping[str, object],
        inner_of: Mapping[int, tuple[object, Mapping[str, SourceLayout]]],
        length: int | None = None,
    ) -> None:
        self._modules = modules
        self._inner_of = inner_of
        self._len = length

    @classmethod
    def of_inner(cls, modules: dict[str, Mapping[str, SourceLayout]], length: int) -> ByModule:
        """Entries from ``{module FQN: {param path: layout}}`` (how one is unpickled)."""
        inner_of = {id(inner): (inner, inner) for inner in modules.values()}
        return cls(modules, inner_of, length)

    def __reduce__(
        self,
    ) -> tuple[Callable[..., ByModule], tuple[dict[str, Mapping[str, SourceLayout]], int]]:
        # By value: ids mean nothing in another process (shared inner maps pickle once).
        inner_of = self._inner_of
        modules = {m: inner_of[id(key)][1] for m, key in self._modules.items()}  # key held
        return (ByModule.of_inner, (modules, len(self)))

    def _find(self, fqn: object) -> SourceLayout | None:
        if type(fqn) is not str:
            fqn = _plain_key(fqn)
            if fqn is None:
                return None
        modules, inner_of = self._modules, self._inner_of
        end = len(fqn)
        while (end := fqn.rfind(".", 0, end)) > 0:  # the longest module FQN first
            key = modules.get(fqn[:end])
            if key is not None:
                layout = inner_of[id(key)][1].get(fqn[end + 1 :])  # key held by modules
                if layout is not None:
                    return layout
        key = modules.get("")
        return None if key is None else inner_of[id(key)][1].get(fqn)  # key held

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(map(len, map(itemgetter(1), self.by_module())))
        return self._len

    def with_layouts(self, change: Callable[[SourceLayout], SourceLayout]) -> ByModule:
        r"""These entries with every layout ``change``\ d, each inner map once: the
        same modules, the same sharing of inner maps between them."""
        done: dict[int, tuple[Mapping[str, SourceLayout], dict[str, SourceLayout]]] = {}
        held: dict[int, tuple[object, Mapping[str, SourceLayout]]] = {}
        for key_id, (key, inner) in self._inner_of.items():
            hit = done.get(id(inner))  # the entry holds inner
            if hit is None or hit[0] is not inner:
                changed = {path: change(layout) for path, layout in inner.items()}
                hit = done[id(inner)] = (inner, changed)
            held[key_id] = (key, hit[1])
        return ByModule(self._modules, held, self._len)

    def completed(self, fqns: Sequence[str], default: SourceLayout) -> ByModule | None:
        """These entries, then each of ``fqns`` they lack (once, in the order given) with
        ``default``, as ``dict.setdefault`` in a loop orders them: kept by module, the
        added ones as the root module's (``None`` when a root module comes before other
        modules: the caller then spells the entries out by FQN).

        The FQNs these entries spell are struck from the set of ``fqns`` at C speed, each
        module kind's modules picked out and joined with each of its paths; what is left
        is what they lack (usually nothing). An added FQN is none of theirs, so the root
        module spells it and nothing else."""
        if not self._root_last():
            return None  # before the work of finding them
        lacked = _lacked(fqns, self._spelled())
        return self.with_added(dict.fromkeys(lacked, default))

    def _spelled(self) -> Iterator[Iterable[str]]:
        """The FQNs of these entries, a batch at a time, each spelled at C speed: the root
        module's paths (its FQNs), then each module kind's modules joined with each of
        its paths."""
        modules = self._modules
        yield self.inner("") or ()
        names, keys = tuple(modules), tuple(modules.values())
        for key, inner in self._inner_of.values():
            picked = filter(None, compress(names, map(is_, keys, repeat(key))))
            prefixes = list(map(add, picked, repeat(".")))
            for path in inner:
                yield map(add, prefixes, repeat(path))

    def with_added(self, added: dict[str, SourceLayout]) -> ByModule | None:
        """These entries, then ``added`` (checked layouts of FQNs these lack, never to be
        changed) as the root module's, after its own; ``None`` when a root module comes
        before other modules (its entries would not come last)."""
        if not added:
            return self
        if not self._root_last():
            return None
        root = self.inner("")
        new_root = added if root is None else {**root, **added}
        modules = dict(self._modules)
        modules.pop("", None)
        modules[""] = new_root  # last
        inner_of = dict(self._inner_of)
        inner_of[id(new_root)] = (new_root, new_root)  # the entry holds new_root
        length = None if self._len is None else self._len + len(added)
        return ByModule(modules, inner_of, length)

    def _root_last(self) -> bool:
        """Whether the root module, if any, is the last module (its entries come last)."""
        modules = self._modules
        if "" not in modules:
            return True
        if isinstance(modules, dict):  # as every table the package builds holds: at once
            last: str = next(reversed(modules))
            return last == ""
        return tuple(modules)[-1] == ""

    def inner(self, module: str) -> Mapping[str, SourceLayout] | None:
        """The layouts of ``module``'s parameter paths (``{"wq.weight": ...}``), or
        ``None`` when the plan had no such module."""
        key = self._modules.get(module)
        return None if key is None else self._inner_of[id(key)][1]  # key held by modules

    def lookups(
        self,
    ) -> tuple[
        Callable[[str], object | None], Mapping[int, tuple[object, Mapping[str, SourceLayout]]]
    ]:
        """``(key_of, inner_of)`` for a caller's own loop over many modules (``inner``
        inlined): ``key_of(module)`` is the module's key object or ``None``, and
        ``inner_of[id(key)][1]`` its inner map (the key is held by the modules, so its id
        is its own). Modules of one kind share one key, so a caller that remembers the
        last key looks its inner map up once per run of a kind."""
        return self._modules.get, self._inner_of

    def by_module(self) -> Iterator[tuple[str, Mapping[str, SourceLayout]]]:
        """``(module FQN, {param path: layout})`` in plan order."""
        inner_of = self._inner_of
        for module, key in self._modules.items():
            yield module, inner_of[id(key)][1]  # key held by modules

    def by_module_with(
        self, other: ByModule
    ) -> Iterator[tuple[str, Mapping[str, SourceLayout], Mapping[str, SourceLayout] | None]]:
        """``(module FQN, {param path: layout}, other's map of that module or None)`` in
        plan order; in step when both tables were built from one plan's modules."""
        inner_of, there_of = self._inner_of, other._inner_of
        if other._modules is self._modules:  # every key is held by the one dict
            for module, key in self._modules.items():
                yield module, inner_of[id(key)][1], there_of[id(key)][1]  # key held
            return
        there_at = other._modules.get
        for module, key in self._modules.items():
            inner = inner_of[id(key)][1]  # key is held by modules
            there = there_at(module)  # held by other's modules
            yield module, inner, None if there is None else there_of[id(there)][1]

    def __iter__(self) -> Iterator[str]:
        return map(itemgetter(0), _ByModuleItems(self))


class _ByModuleItems(ItemsView[str, SourceLayout]):
    _mapping: ByModule

    def __iter__(self) -> Iterator[tuple[str, SourceLayout]]:
        for module, inner in self._mapping.by_module():
            if module:
                prefix = f"{module}."
                for path, layout in inner.items():
                    yield prefix + path, layout
            else:
                yield from inner.items()


class _ByModuleValues(ValuesView[SourceLayout]):
    _mapping: ByModule

    def __iter__(self) -> Iterator[SourceLayout]:
        for _, inner in self._mapping.by_module():
            yield from inner.values()


ByModule._items_view, ByModule._values_view = _ByModuleItems, _ByModuleValues


_MAX_SCANS: Final = 8
"""How many distinct FQNs a ``Listed`` looks up by scanning before it makes its dict."""


class Listed(_Kept):
    """Checked entries kept as sequences: the FQNs in table order, and for each the index
    of its layout among a few distinct ones.

    The read-only mapping a table holds when ``build_table`` matched a plan by pattern
    against a model's FQNs: the FQN tuple it was given, one small int per FQN, and the
    layouts, so building the table makes no dict of a million FQNs, and a change of
    every layout (``with_layouts``: ``compose_table``) changes the few layouts, not the
    entries. Iterating it, its length and its items (what ``bind`` in module order,
    ``lint`` and JSON read) use the sequences; the first few lookups (the tied members a
    build checks) scan the FQNs at C speed, and any further lookup makes the dict by FQN
    once. Private to the package, like ``_CheckedEntries``: built only from distinct
    FQNs and checked layouts, and never changed.
    """

    __slots__ = ("_by_fqn", "_fqns", "_kinds", "_layouts", "_scanned")
    _fqns: tuple[str, ...]
    _kinds: Sequence[int]
    """The index in ``_layouts`` of each FQN's layout."""
    _layouts: tuple[SourceLayout, ...]
    _by_fqn: dict[str, SourceLayout] | None
    _scanned: dict[str, SourceLayout | None]
    """What each FQN looked up so far by scanning gave (``None``: no entry)."""

    def __init__(
        self, fqns: tuple[str, ...], kinds: Sequence[int], layouts: tuple[SourceLayout, ...]
    ) -> None:
        self._fqns = fqns
        self._kinds = kinds
        self._layouts = layouts
        self._by_fqn = None
        self._scanned = {}

    def __reduce__(
        self,
    ) -> tuple[type[Listed], tuple[tuple[str, ...], tuple[int, ...], tuple[SourceLayout, ...]]]:
        return (Listed, (self._fqns, tuple(self._kinds), self._layouts))

    def _find(self, fqn: object) -> SourceLayout | None:
        if type(fqn) is not str:
            fqn = _plain_key(fqn)
            if fqn is None:
                return None
        by_fqn = self._by_fqn
        if by_fqn is not None:
            return by_fqn.get(fqn)
        scanned = self._scanned
        if fqn in scanned:
            return scanned[fqn]
        if len(scanned) >= _MAX_SCANS:
            return self.as_dict().get(fqn)
        try:
            found: SourceLayout | None = self._layouts[self._kinds[self._fqns.index(fqn)]]
        except ValueError:
            found = None
        scanned[fqn] = found
        return found

    def as_dict(self) -> dict[str, SourceLayout]:
        """The entries as a dict by FQN, made on the first call and kept (for a caller
        that looks many up; never to be changed)."""
        by_fqn = self._by_fqn
        if by_fqn is None:
            by_fqn = self._by_fqn = dict(_ListedItems(self))
        return by_fqn

    def with_layouts(self, change: Callable[[SourceLayout], SourceLayout]) -> Listed:
        r"""These entries with every layout ``change``\ d, each distinct one once."""
        return Listed(self._fqns, self._kinds, tuple(map(change, self._layouts)))

    def updated(self, changes: Mapping[str, SourceLayout]) -> Listed | None:
        """These entries with ``changes`` (checked layouts) replacing or added after them,
        as ``dict.update`` orders them; ``None`` when they are more than a few (each is
        found by a scan: the caller then spells the entries out by FQN)."""
        if len(changes) > _MAX_SCANS:
            return None
        fqns, kinds, layouts = self._fqns, list(self._kinds), list(self._layouts)
        added: list[str] = []
        for fqn, layout in changes.items():
            try:
                kind = layouts.index(layout)  # a layout it has already (the few distinct)
            except ValueError:
                kind = len(layouts)
                layouts.append(layout)
            try:
                kinds[fqns.index(fqn)] = kind
            except ValueError:
                added.append(fqn)
                kinds.append(kind)
        return Listed(fqns + tuple(added), kinds, tuple(layouts))

    def completed(self, fqns: Sequence[str], default: SourceLayout) -> Listed:
        """These entries, then each of ``fqns`` they lack (once, in the order given) with
        ``default``, as ``dict.setdefault`` in a loop orders them; found at C speed with
        one set of these FQNs, and kept listed."""
        if type(fqns) is tuple and fqns == self._fqns:
            return self  # the FQNs the table was built from (each compared by identity)
        # One set of these FQNs, probed by the given ones (cheaper than striking these
        # from a set of those, as a table kept by module does: these are spelled already)
        missing = tuple(dict.fromkeys(filterfalse(set(self._fqns).__contains__, fqns)))
        if not missing:
            return self
        kinds = [*self._kinds, *repeat(len(self._layouts), len(missing))]
        return Listed(self._fqns + missing, kinds, (*self._layouts, default))

    def __len__(self) -> int:
        return len(self._fqns)

    def __iter__(self) -> Iterator[str]:
        return iter(self._fqns)


class _ListedItems(ItemsView[str, SourceLayout]):
    _mapping: Listed

    def __iter__(self) -> Iterator[tuple[str, SourceLayout]]:
        entries = self._mapping
        return zip(entries._fqns, map(entries._layouts.__getitem__, entries._kinds), strict=True)


class _ListedValues(ValuesView[SourceLayout]):
    _mapping: Listed

    def __iter__(self) -> Iterator[SourceLayout]:
        entries = self._mapping
        return map(entries._layouts.__getitem__, entries._kinds)


Listed._items_view, Listed._values_view = _ListedItems, _ListedValues


def _check_entries(entries: Mapping[str, SourceLayout]) -> Mapping[str, SourceLayout]:
    if type(entries) is _CheckedEntries or type(entries) is ByModule or type(entries) is Listed:
        return entries
    raw: object = entries
    if not isinstance(raw, Mapping):
        msg = f"a table's entries must be a mapping from FQN to SourceLayout, got {quote(raw)}"
        raise LayoutError(msg)
    checked: dict[str, SourceLayout] = {}
    seen: set[SourceLayout] = set()  # by value: a lazily built mapping may free each layout
    for key, layout in mapping_items(entries, "a table's entries", "{'wq.weight': layout}"):
        if not is_fqn(key):
            msg = f"entries: a parameter FQN must be a non-empty string, got {quote(key)}"
            raise LayoutError(msg)
        fqn = key if type(key) is str else plain_str(key)  # a subclass's __hash__ never runs
        raw_layout: object = layout
        if not isinstance(raw_layout, SourceLayout):
            msg = f"{clip(fqn)}: {quote(raw_layout)} is not a SourceLayout"
            raise LayoutError(msg, fqn=fqn)
        if layout not in seen:
            check_no_partial(fqn, layout)
            seen.add(layout)
        checked[fqn] = layout
    return checked


def is_fqn(name: object) -> bool:
    """Whether ``name`` can be a parameter FQN: a non-empty string."""
    return isinstance(name, str) and bool(name)


def check_fqn(name: object, arg: str) -> str:
    """``name``, checked to be a parameter FQN (a non-empty string), as plain text (a
    ``str`` subclass's own ``__hash__`` and ``__eq__`` never run where it is used).

    Raises:
        LayoutError: naming ``arg``.
    """
    if not isinstance(name, str) or not name:
        msg = f"{arg}: a parameter FQN must be a non-empty string, got {quote(name)}"
        raise LayoutError(msg)
    return plain_str(name)


def check_fqns(names: Sequence[object], arg: str) -> None:
    """Every one of ``names`` a parameter FQN (``check_fqn``), at C speed when each is a
    non-empty plain ``str``.

    Raises:
        LayoutError: naming ``arg``, for the first that is not.
    """
    if not (set(map(type, names)) <= {str} and all(names)):
        for name in names:
            check_fqn(name, arg)


def partial_error(layout: SourceLayout, fqn: str | None = None) -> LayoutError | None:
    """The error for the first ``Partial`` in a parameter's layout, or ``None``.

    Parameters are whole values, never a pending reduction; the error names the FQN
    (where given), the axis and the placement.
    """
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if isinstance(p, Partial):
            shown = format_placement(p)
            who = f"{clip(fqn)}: " if fqn else ""
            msg = (
                f"{who}{shown} on axis {clip(axis.name)!r} in {clip(str(layout))}: a parameter "
                "cannot be a pending reduction; declare R or S(dim) on that axis"
            )
            return LayoutError(msg, fqn=fqn, axis=axis.name, placement=shown)
    return None


def check_no_partial(fqn: str, layout: SourceLayout) -> None:
    """A parameter's layout holds no ``Partial``: parameters are whole values.

    Raises:
        LayoutError: naming the FQN, the axis and the placement.
    """
    error = partial_error(layout, fqn)
    if error is not None:
        raise error


def as_groups(groups: Iterable[Iterable[str]], arg: str = "tied") -> tuple[frozenset[str], ...]:
    """Groups of FQNs in one canonical order (by their sorted members).

    So two tables that differ only in the order of their tied groups are equal.

    Raises:
        LayoutError: naming ``arg``: not a collection of collections of FQNs.
    """
    out: list[frozenset[str]] = []
    for group in as_items(groups, arg, "[('emb.weight', 'head.weight')]"):
        members = as_items(group, f"{arg}: each group", "('emb.weight', 'head.weight')")
        for fqn in members:
            if not is_fqn(fqn):
                msg = f"{arg}: a group holds parameter FQNs, got {quote(fqn)} in {quote(members)}"
                raise LayoutError(msg)
        out.append(frozenset(map(plain_str, members)))  # a str subclass as its plain text
    if len(out) > 1:
        out.sort(key=sorted)
    return tuple(out)


def groups_repr(groups: tuple[frozenset[str], ...]) -> str:
    """``repr(groups)`` with each group's members sorted: a set's own order can differ
    between equal sets (one unpickled, under another hash seed), so equal values print
    alike."""
    shown = [f"frozenset({{{', '.join(map(repr, sorted(g)))}}})" for g in groups]
    return f"({', '.join(shown)}{',' * (len(shown) == 1)})"


def _check_drop_fqn(_: object, __: attrs.Attribute[str], value: object) -> None:
    check_fqn(value, "Drop.fqn")


def _check_drop_placement(_: object, __: attrs.Attribute[Placement], value: object) -> None:
    if not is_placement(value):
        msg = f"Drop.placement: {quote(value)} is not a placement such as Shard(0)"
        raise LayoutError(msg)


@attrs.frozen(cache_hash=True)
class Drop:
    """A non-Replicate placement ``build_table`` dropped: its axis is not in the target mesh.

    The run knows ``axis`` (the plan's ``mesh_axes`` name it) but the parameter's mesh
    ``mesh`` lacks it, so the axis has size 1 there and the placement has no effect.
    That is right when the run really has no such axis, and a silent loss of sharding
    when the mesh misspells it (``tpp`` for ``tp``), so every drop is recorded.
    """

    fqn: str = attrs.field(converter=plain_str, validator=_check_drop_fqn, **REQUIRED)
    mesh: str = attrs.field(converter=plain_str, validator=_check_mesh_role, **REQUIRED)
    axis: AxisName = attrs.field(converter=as_axis, **REQUIRED)
    placement: Placement = attrs.field(validator=_check_drop_placement, **REQUIRED)

    def __attrs_pre_init__(self, fqn: str, mesh: str, axis: AxisLike, placement: Placement) -> None:
        check_init(self, "fqn", (fqn, mesh, axis, placement))

    def __str__(self) -> str:
        return (
            f"{clip(self.fqn)}: {format_placement(self.placement)} on axis "
            f"{clip(self.axis.name)!r} dropped (the {clip(self.mesh)} mesh has no such axis)"
        )


def _as_drops(drops: Iterable[Drop]) -> tuple[Drop, ...]:
    return as_instances(drops, Drop, "dropped", "(Drop('w', 'dense', 'tp', Shard(0)),)")


@attrs.frozen(eq=False, repr=False)
class ParamLayoutTable(DictView[str, SourceLayout]):
    """The source layout of every parameter, by FQN, and the groups that share storage.

    A read-only mapping in insertion order. ``tied`` holds groups of FQNs that share one
    storage (an embedding and its LM head), in a canonical order; every member has an
    entry and all members of a group have the same layout. No layout holds a ``Partial``.
    ``dropped`` records what ``build_table`` dropped on axes a mesh lacks.

    Two tables are equal when their entries and tied groups are (order aside). A table
    without tied groups also equals any other ``Mapping`` with the same entries, as a
    read-only mapping does; a table with tied groups equals only tables with the same
    groups (a mapping has none), so ``==`` stays transitive. Equal tables hash equal.

    A key that is not a ``str`` is no FQN: ``in`` is false, ``get`` gives the default,
    and ``table[key]`` is a ``LayoutError`` naming the key's type. A ``str`` subclass is
    looked up as the plain text it holds.
    """

    _items: Mapping[str, SourceLayout] = attrs.field(
        alias="entries", converter=_check_entries, **REQUIRED
    )
    tied: tuple[frozenset[str], ...] = attrs.field(default=(), kw_only=True, converter=as_groups)
    dropped: tuple[Drop, ...] = attrs.field(
        default=(), kw_only=True, converter=_as_drops, eq=False, repr=False
    )
    """The non-Replicate placements ``build_table`` dropped on axes their mesh lacks
    (not part of the table's value: not compared, hashed or serialized)."""

    @tied.validator
    def _check_tied(self, _: attrs.Attribute[tuple[frozenset[str], ...]], value: object) -> None:
        owner: dict[str, int] = {}
        for i, group in enumerate(self.tied):
            members = sorted(group)
            if len(group) < 2:
                msg = f"tied group {clip(str(members))} has fewer than two members; drop it"
                raise LayoutError(msg)
            layouts = {self._items.get(fqn) for fqn in group}
            for fqn in members:
                if fqn in owner:
                    other = clip(str(sorted(self.tied[owner[fqn]])))
                    msg = (
                        f"{clip(fqn)} is in two tied groups {other} and {clip(str(members))}; "
                        "tied groups are disjoint (merge them with merge_tied)"
                    )
                    raise LayoutError(msg, fqn=fqn)
                owner[fqn] = i
                if fqn not in self._items:
                    msg = (
                        f"{clip(fqn)}: tied in {clip(str(members))} but has no entry; every "
                        "tied member needs one (merge_tied gives missing members the group's "
                        "layout)"
                    )
                    raise LayoutError(msg, fqn=fqn)
            if len(layouts) > 1:
                shown = clip(", ".join(f"{fqn}: {self._items[fqn]}" for fqn in members[:8]))
                msg = (
                    f"tied group {clip(str(members))} has different layouts ({shown}); "
                    "parameters that share storage need one layout (use merge_tied)"
                )
                raise LayoutError(msg, fqn=members[0])

    def __attrs_pre_init__(
        self,
        entries: Mapping[str, SourceLayout],
        *,
        tied: Iterable[Iterable[str]],
        dropped: Iterable[Drop],
    ) -> None:
        check_init(self, "_items", (entries, tied, dropped))

    def _value_extras(self) -> object:
        return self.tied  # so a tied table equals no mapping that has no tied groups

    def __getitem__(self, fqn: str) -> SourceLayout:
        if type(fqn) is not str:
            fqn = _lookup_key(fqn)
        return self._items[fqn]

    def __contains__(self, fqn: object) -> bool:
        if type(fqn) is not str:
            if not isinstance(fqn, str):
                return False  # no FQN is anything but text
            fqn = plain_str(fqn)
        return fqn in self._items

    @overload
    def get(self, fqn: str, /) -> SourceLayout | None: ...
    @overload
    def get(self, fqn: str, /, default: SourceLayout) -> SourceLayout: ...
    @overload
    def get(self, fqn: str, /, default: T) -> SourceLayout | T: ...
    def get(self, fqn: str, /, default: object = None) -> object:
        if type(fqn) is not str:
            raw: object = fqn
            if not isinstance(raw, str):
                return default
            fqn = plain_str(fqn)
        return self._items.get(fqn, default)

    def __repr__(self) -> str:
        tied = f", tied={groups_repr(self.tied)}" if self.tied else ""
        return f"ParamLayoutTable({self._items!r}{tied})"

    def __str__(self) -> str:
        if not self._items:
            return "(empty table)"
        # FQNs escaped: a control character in one must not move a terminal's cursor
        names = [escape(fqn) for fqn in self._items]
        width = max(map(len, names))
        lines = [
            f"{name:<{width}}  {layout}"
            for name, layout in zip(names, self._items.values(), strict=True)
        ]
        lines.extend(f"tied: {', '.join(map(escape, sorted(g)))}" for g in self.tied)
        return "\n".join(lines)

    def group_of(self, fqn: str) -> frozenset[str]:
        """The FQNs sharing storage with ``fqn`` (itself included; just itself if untied)."""
        fqn = check_fqn(fqn, "fqn")
        for group in self.tied:
            if fqn in group:
                return group
        return frozenset((fqn,))

    def with_entries(self, entries: Mapping[str, SourceLayout]) -> ParamLayoutTable:
        """This table with ``entries`` added or replacing existing ones, tied kept."""
        raw: object = entries
        if not isinstance(raw, Mapping):
            msg = f"entries must map FQN to SourceLayout, got {quote(raw)}"
            raise LayoutError(msg)
        merged = dict(self._items.items())
        for key, layout in mapping_items(entries, "entries", "{'wq.weight': layout}"):
            merged[check_fqn(key, "entries")] = layout  # each checked with the rest below
        return ParamLayoutTable(merged, tied=self.tied, dropped=self.dropped)
