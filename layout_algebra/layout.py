"""Source layouts and the table that gives one to every parameter.

A ``SourceLayout`` is a parameter's placements on the non-FSDP axes of one source
sub-mesh; a ``ParamLayoutTable`` maps parameter FQNs to them and records which
parameters share storage (``tied``).
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from operator import is_
from typing import Final, TypeVar, overload

import attrs

from layout_algebra._args import as_instances, as_items, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, DictView, check_init, checked_call, intern
from layout_algebra._grouping import OncePerKey
from layout_algebra._text import clip, escape, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis, check_distinct_axes
from layout_algebra.errors import LayoutError
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


@checked_call
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
    def _check_one_per_axis(self, _: attrs.Attribute[tuple[Placement, ...]], value: object) -> None:
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


class CheckedEntries(dict[str, SourceLayout]):
    """Entries the package built and checked itself: each FQN a non-empty ``str``, each
    layout an interned one with no ``Partial``. A table copies them without checking
    them again (``build_table`` makes them, parameter by parameter or sort by sort)."""

    __slots__ = ()


_ENTRIES_EXAMPLE: Final = "{'wq.weight': SourceLayout('dense', ['tp'], [Shard(0)])}"


def _check_entries(entries: Mapping[str, SourceLayout]) -> dict[str, SourceLayout]:
    """A table's own dict of ``entries``, each checked, its layouts the interned ones.

    Keys are checked by type in one pass, and each distinct layout once (a model of a
    million parameters has a few): no ``Partial``, then its interned object, which
    every entry holding an equal layout then holds.
    """
    raw: object = entries
    if type(raw) is CheckedEntries:
        return dict(raw)
    if not isinstance(raw, Mapping):
        msg = f"a table's entries must be a mapping from FQN to SourceLayout, got {quote(raw)}"
        raise LayoutError(msg)
    items = mapping_items(entries, "a table's entries", _ENTRIES_EXAMPLE)
    keys: Collection[object] = raw.keys() if type(raw) is dict else [k for k, _ in items]
    plain_keys = set(map(type, keys)) <= {str} and all(keys)
    checked = (dict(raw) if type(raw) is dict else dict(items)) if plain_keys else None
    try:
        distinct = set(checked.values()) if checked is not None else None
    except TypeError:  # an unhashable value: no layout, named below
        distinct = None
    if checked is None or distinct is None or not {type(v) for v in distinct} <= {SourceLayout}:
        checked = _checked_one_by_one(items)
        distinct = set(checked.values())
    canonical: dict[SourceLayout, SourceLayout] = {}
    for layout in distinct:
        if partial_error(layout) is not None:
            fqn = next(fqn for fqn, mine in checked.items() if mine == layout)
            check_no_partial(fqn, layout)
        canonical[layout] = interned(layout)
    # Equal layouts made apart (by a caller) become the interner's one object.
    layouts = checked.values()
    if not all(map(is_, layouts, map(canonical.__getitem__, layouts))):
        checked = {fqn: canonical[layout] for fqn, layout in checked.items()}
    return checked


def _checked_one_by_one(items: Iterable[tuple[str, SourceLayout]]) -> dict[str, SourceLayout]:
    """``items`` in a dict, each key and layout checked (a ``str`` subclass as its text).

    Raises:
        LayoutError: the first key that is no FQN, or value that is no layout.
    """
    checked: dict[str, SourceLayout] = {}
    for key, layout in items:
        fqn = check_fqn(key, "entries")
        raw_layout: object = layout
        if not isinstance(raw_layout, SourceLayout):
            msg = f"{clip(fqn)}: {quote(raw_layout)} is not a SourceLayout"
            raise LayoutError(msg, fqn=fqn)
        checked[fqn] = layout
    return checked


def interned(layout: SourceLayout) -> SourceLayout:
    """The one object kept for the layouts equal to ``layout`` (bounded: see ``_frozen``)."""
    found = intern(layout, layout)
    assert isinstance(found, SourceLayout)
    return found


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
    """Every one of ``names`` a parameter FQN (``check_fqn``), in one pass when each is a
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


@checked_call
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


@checked_call
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

    _items: dict[str, SourceLayout] = attrs.field(
        alias="entries", converter=_check_entries, **REQUIRED
    )
    tied: tuple[frozenset[str], ...] = attrs.field(default=(), kw_only=True, converter=as_groups)
    dropped: tuple[Drop, ...] = attrs.field(
        default=(), kw_only=True, converter=_as_drops, eq=False, repr=False
    )
    """The non-Replicate placements ``build_table`` dropped on axes their mesh lacks: a
    record of how the table was made, written in its JSON, not part of its value (not
    compared, hashed or fingerprinted)."""

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
        raw: object = fqn
        if not isinstance(raw, str):
            msg = (
                f"a table is looked up by parameter FQN (a str such as 'wq.weight'), got "
                f"{type(raw).__name__} {quote(raw)}"
            )
            raise LayoutError(msg)
        return self._items[plain_str(fqn)]

    def __contains__(self, fqn: object) -> bool:
        return isinstance(fqn, str) and plain_str(fqn) in self._items

    @overload
    def get(self, fqn: str, /) -> SourceLayout | None: ...
    @overload
    def get(self, fqn: str, /, default: SourceLayout) -> SourceLayout: ...
    @overload
    def get(self, fqn: str, /, default: T) -> SourceLayout | T: ...
    def get(self, fqn: str, /, default: object = None) -> object:
        raw: object = fqn
        if not isinstance(raw, str):
            return default  # no FQN is anything but text
        return self._items.get(plain_str(fqn), default)

    def __repr__(self) -> str:
        tied = f", tied={groups_repr(self.tied)}" if self.tied else ""
        return f"ParamLayoutTable({self._items!r}{tied})"

    def __str__(self) -> str:
        return format(self, "")

    def __format__(self, encoding: str) -> str:
        """One line per entry, the layouts in one column; ``format(table, "ascii")`` is
        the text for an output in that encoding (``""``: any).

        FQNs are escaped before the column is measured: a control character must not move
        a terminal's cursor, and a character the encoding cannot write is spelled as its
        stream spells it (``\\xe9``), so the column stays one column there too.
        """
        code = encoding or None
        if code is not None:
            try:
                codecs.lookup(code)
            except LookupError:
                msg = (
                    f"a table's format spec is the output's encoding, such as 'ascii' or "
                    f"'utf-8' (or '' for any), got {quote(encoding)}"
                )
                raise LayoutError(msg) from None
        if not self._items:
            return "(empty table)"
        names = [escape(fqn, code) for fqn in self._items]
        width = max(map(len, names))
        lines = [
            f"{name:<{width}}  {layout}"
            for name, layout in zip(names, self._items.values(), strict=True)
        ]
        lines.extend(f"tied: {', '.join(escape(f, code) for f in sorted(g))}" for g in self.tied)
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
        merged = dict(self._items)
        for key, layout in mapping_items(entries, "entries", "{'wq.weight': layout}"):
            merged[check_fqn(key, "entries")] = layout  # each checked with the rest below
        return ParamLayoutTable(merged, tied=self.tied, dropped=self.dropped)

    def fingerprint(self) -> str:
        """A stable digest of the table's value: the same in every process and for every
        insertion order, different when an entry or a tied group differs.

        It follows ``==``: equal tables have one fingerprint, so ``dropped`` (a record of
        how the table was made, outside its value) is not in it: a table read from a
        checkpoint, which records no drops, has the fingerprint of the plan's table.

        A SHA-256 over a canonical text, as ``"v1:<hex>"``: a version line; the FQNs
        sorted, one per line; their layouts (``str(layout)``) in the same order, one per
        line; then one JSON line per tied group, sorted. A column holding a newline in
        one of its texts is written with each text as a JSON string instead, and its
        header line says so.
        """
        # entries read in the table's order, then put in FQN order by their positions
        spelled = OncePerKey(str)  # each distinct layout's text once
        keys, layouts = list(self._items), list(map(spelled.__getitem__, self._items.values()))
        order = sorted(range(len(keys)), key=keys.__getitem__)
        fqns = _column("FQNs", list(map(keys.__getitem__, order)))
        texts = _column("layouts", list(map(layouts.__getitem__, order)))
        tied = sorted(sorted(group) for group in self.tied)
        rest = [json.dumps(["tied", members]) for members in tied]
        text = "\n".join([_FINGERPRINT_VERSION, *fqns, *texts, *rest])
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return f"v1:{digest}"


def _column(name: str, texts: list[str]) -> tuple[str, str]:
    """A header line and ``texts`` one per line; each text as a JSON string when one
    holds a newline (so that every text stays one line), which the header says."""
    lines = "\n".join(texts)
    if lines.count("\n") == max(len(texts) - 1, 0):
        return f"{len(texts)} {name}", lines
    return f"{len(texts)} {name} as JSON strings", "\n".join(map(encode_basestring_ascii, texts))


_FINGERPRINT_VERSION: Final = "layout-algebra-fingerprint-v1"
"""The first line of the text a fingerprint digests: a new format gets a new version."""


def check_table(value: object, arg: str) -> ParamLayoutTable:
    """``value`` checked to be a table: the one "must be a table" message of the package.

    ``arg`` names the argument in the call it was given to, e.g. ``"lint(table=...)"``.

    Raises:
        LayoutError: naming ``arg`` and saying how to make a table.
    """
    if not isinstance(value, ParamLayoutTable):
        msg = (
            f"{arg} must be a ParamLayoutTable, got {type(value).__name__} {quote(value)}; "
            "build one with build_table or read one with from_json"
        )
        raise LayoutError(msg)
    return value
