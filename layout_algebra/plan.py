"""The plan a parallelism planner hands over: named placements per parameter, per module.

``ShardingPlan`` maps module FQNs to ``ModulePlan``\\ s; a ``ModulePlan`` maps each
parameter path (relative to the module, may hold dots: ``experts.w1``) to its *named
placements*, ``{axis: placement}``. All three are frozen, hashable and equal by value.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, ItemsView, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Final, Protocol, Self

import attrs

from layout_algebra._args import as_items, mapping_items, plain_str
from layout_algebra._patterns import WILDCARD
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, axis_str, check_distinct_axes
from layout_algebra.errors import LayoutError
from layout_algebra._frozen import NOT_GIVEN, REQUIRED, FrozenMap, check_init, frozen_map_of
from layout_algebra.placements import Placement, is_placement

__all__ = ["ModulePlan", "NamedLike", "NamedPlacements", "ShardingPlan"]

NamedPlacements = FrozenMap[str, Placement]
"""One parameter's placements by axis name: ``{"tp": Shard(0), "ep": Shard(0)}``."""


class NamedLike(Protocol):
    """Named placements as a planner writes them: any mapping keyed by axis name.

    ``{"tp": Shard(0), "dp_shard": Replicate()}`` or ``{AxisName("tp"): Shard(0)}``. Only
    the read side of a mapping, so mypy accepts a dict literal that mixes placement kinds
    or key kinds (a union of ``Mapping`` types would infer ``dict[str, object]`` for it).
    Anything that is not a ``Mapping`` is still rejected at run time.
    """

    def __len__(self) -> int: ...

    def items(self) -> ItemsView[AxisLike, Placement]: ...


def param_fqn(module: str, param: str) -> str:
    """The parameter's FQN: ``f"{module}.{param}"``, or just ``param`` for the root module."""
    return f"{module}.{param}" if module else param


_SHARED: dict[tuple[tuple[str, Placement], ...], NamedPlacements] = {}
"""Named placements already frozen, by their items: a plan's layout kinds are few, and
equal ones in different modules become one object (bounded, like the axis names)."""
_MAX_SHARED: Final = 4096
_MAX_SHARED_KEY: Final = 256
"""Named placements whose axis names total more characters than this are never shared."""


def as_named(param: str, named: NamedLike) -> NamedPlacements:
    """``named`` checked and frozen: the one normalisation of named placements.

    Axis keys become plain names (``AxisName("tp")`` and ``"tp"`` are one axis, named
    once), every value must be a placement; equal ones share one frozen value.

    Raises:
        LayoutError: naming ``param`` (the parameter), the axis and what is wrong.
    """
    raw: object = named
    if type(raw) is dict or type(raw) is FrozenMap:
        # Fast path: items equal to ones already checked and frozen are that value.
        try:
            shared = _SHARED.get(tuple(raw.items()))
        except TypeError:  # an unhashable value: the full check below reports it
            shared = None
        if shared is not None:
            return shared
    if not isinstance(raw, Mapping):
        msg = (
            f"{clip(param)}: named placements must be a mapping from axis to placement such as "
            f"{{'tp': Shard(0)}}, got {quote(raw)}"
        )
        raise LayoutError(msg, fqn=param)
    out: dict[str, Placement] = {}
    items = mapping_items(
        raw,
        f"{clip(param)}: named placements",
        "{'tp': Shard(0)}",
        error=lambda msg: LayoutError(msg, fqn=param),
    )
    for axis, placement in items:
        try:
            name = axis_str(axis)
        except LayoutError as e:
            msg = f"{clip(param)}: {e.message}"
            raise LayoutError(msg, fqn=param, axis=e.axis) from None
        if name in out:
            msg = f"{clip(param)}: axis {clip(name)!r} is named twice; give one placement per axis"
            raise LayoutError(msg, fqn=param, axis=name)
        if not is_placement(placement):
            msg = (
                f"{clip(param)}: {quote(placement)} on axis {clip(name)!r} is not a placement; "
                "use Shard(d), Replicate(), Partial(op) or parse_placement('S(0)')"
            )
            raise LayoutError(msg, fqn=param, axis=name)
        out[name] = placement
    key = tuple(out.items())
    shared = _SHARED.get(key)
    if shared is None:
        shared = FrozenMap(out)
        if len(_SHARED) < _MAX_SHARED and sum(map(len, out)) <= _MAX_SHARED_KEY:
            _SHARED[key] = shared
    return shared


_PATHS: set[str] = set()
"""Parameter paths already checked: planners spell a handful in every layer (bounded, like
the shared named placements)."""


def _frozen_params(params: dict[object, object]) -> FrozenMap[str, NamedPlacements] | None:
    """``params`` checked and frozen in one pass, or ``None`` for the full check.

    That is when every path is a good one and every value a ``dict`` whose items equal
    named placements already checked and frozen (``_SHARED``): a planner that writes a
    new dict per parameter writes the same few again and again.
    """
    paths, get = _PATHS, _SHARED.get
    out: dict[str, NamedPlacements] = {}
    for path, named in params.items():
        if type(path) is not str or type(named) is not dict:
            return None
        if path not in paths:
            if not _is_path(path):
                return None
            if len(paths) < _MAX_SHARED and len(path) <= _MAX_SHARED_KEY:
                paths.add(path)
        try:
            shared = get(tuple(named.items()))
        except TypeError:  # an unhashable value: the full check reports it
            return None
        if shared is None:
            return None
        out[path] = shared
    return frozen_map_of(out)


ModuleParams = FrozenMap[str, NamedPlacements]
"""A module's named placements by parameter path, frozen."""


class _Kind:
    """One kind of module params already checked: the package's own plain-dict copy (never
    changed), the frozen value, and the module plan made of it per ``expert_parallel``."""

    __slots__ = ("frozen", "plain", "plans")

    def __init__(self, frozen: ModuleParams) -> None:
        self.frozen = frozen
        self.plain = {path: dict(named.items()) for path, named in frozen.items()}
        self.plans: list[ModulePlan | None] = [None, None]


_KNOWN: dict[int, list[_Kind]] = {}
"""Module params already checked and frozen, by their number of parameters, the last one
used first. A planner writes a new params dict for every module, but a model's modules
are of a few kinds, so a new dict equal to one of these (compared by value at C speed:
equal placements are one object) is that frozen value, checked again only when it
differs."""
_MAX_KINDS: Final = 16
"""At most this many module params kept for one number of parameters."""
_MAX_MODULE_PATHS: Final = 4096
"""Module params whose paths total more characters than this are never kept."""


def _known(params: Mapping[object, object]) -> _Kind | None:
    """The kind of module params equal to ``params`` already checked, if any."""
    kinds = _KNOWN.get(len(params))
    if kinds is None:
        return None
    try:
        for i, kind in enumerate(kinds):
            if params == kind.plain:
                if i:
                    kinds.insert(0, kinds.pop(i))  # the last one used first
                return kind
    except Exception:  # a key or value whose == raises: the full check names it
        return None
    return None


def _remember(frozen: ModuleParams) -> tuple[ModuleParams, _Kind | None]:
    """``frozen`` and its kind, kept unless it is too large to keep."""
    if len(frozen) > _MAX_SHARED or sum(map(len, frozen)) > _MAX_MODULE_PATHS:
        return frozen, None
    kinds = _KNOWN.setdefault(len(frozen), [])
    kinds.insert(0, _Kind(frozen))
    del kinds[_MAX_KINDS:]
    return frozen, kinds[0]


def _as_params(params: Mapping[str, NamedLike]) -> tuple[ModuleParams, _Kind | None]:
    """``params`` checked and frozen, and the kind kept of it (if it is kept)."""
    raw: object = params
    if type(raw) is dict or type(raw) is FrozenMap:  # a plan's own (evolve, unpickling)
        known = _known(raw)
        if known is not None:
            return known.frozen, known
    if type(raw) is dict:
        frozen = _frozen_params(raw)
        if frozen is not None:
            return _remember(frozen)
    if not isinstance(raw, Mapping):
        msg = (
            f"a module plan's params must map parameter paths to named placements, got {quote(raw)}"
        )
        raise LayoutError(msg)
    # Planners reuse one dict for every parameter laid out alike: convert each once (and
    # equal ones across modules share one frozen value, see as_named). The memo holds each
    # object it is keyed by, so its id cannot be reused by another object while the memo
    # lives: a lazily built mapping may free each dict after handing it out.
    converted: dict[int, tuple[object, NamedPlacements]] = {}
    out: dict[str, NamedPlacements] = {}
    example = "{'wq.weight': {'tp': Shard(0)}}"
    for path, named in mapping_items(params, "a module plan's params", example):
        if not _is_path(path):
            msg = (
                f"parameter path {quote(path)} must be a non-empty dotted name such as "
                "'wq.weight' (a segment may be '*', matching any one segment)"
            )
            raise LayoutError(msg, fqn=_shown_key(path))
        hit = converted.get(id(named))
        if hit is None or hit[0] is not named:
            hit = converted[id(named)] = (named, as_named(path, named))
        out[path] = hit[1]
    return _remember(frozen_map_of(out))


def _shown_key(key: object) -> str:
    """A mapping key for an error's ``.fqn``: itself when a string, else its quote."""
    return clip(key) if isinstance(key, str) else quote(key)


def _segments_ok(name: str) -> bool:
    """Non-empty dotted segments, each a name or ``*`` alone (``layers.*.wq``)."""
    return all(s and (s == WILDCARD or WILDCARD not in s) for s in name.split("."))


def _is_path(name: object) -> bool:
    """A parameter path: dotted segments (``wq.weight``, ``experts.w1``, ``*.weight``)."""
    return type(name) is str and bool(name) and _segments_ok(name)


@attrs.frozen(init=False)
class ModulePlan:
    """The named placements of one module's parameters.

    ``params`` maps a parameter path relative to the module to ``{axis: placement}``; a
    path may hold ``*`` segments (``*.weight``), as module keys may. ``expert_parallel``
    marks a module whose experts are sharded over ``ep``: its parameters with a ``Shard``
    on ``ep`` go to the expert mesh.
    """

    params: ModuleParams = attrs.field(**REQUIRED)
    expert_parallel: bool = attrs.field(default=False, kw_only=True)

    if TYPE_CHECKING:  # what calls are checked against (``params`` required); none at run time

        def __init__(
            self, params: Mapping[str, NamedLike], *, expert_parallel: bool = False
        ) -> None: ...

    def __new__(
        cls, params: Mapping[str, NamedLike] = NOT_GIVEN, *, expert_parallel: bool = False
    ) -> Self:
        # Written out rather than generated: a planner makes one per module, a million
        # parameters' worth. Equal module plans are one object (a model's modules are of
        # a few kinds), so a plan made of them is checked by identity, module by module.
        raw: object = params
        flag: object = expert_parallel
        if type(raw) is dict and type(flag) is bool and cls is ModulePlan:
            # The common case inline: params equal to the kind used last.
            kinds = _KNOWN.get(len(raw))
            if kinds:
                last = kinds[0]
                try:
                    same = raw == last.plain
                except Exception:  # a key or value whose == raises: the full check names it
                    same = False
                if same and (plan := last.plans[expert_parallel]) is not None:
                    return plan  # type: ignore[return-value]  # cls is ModulePlan
        if raw is NOT_GIVEN:  # a LayoutError naming it, not Python's bare TypeError
            check_init(object.__new__(cls), "params", (params, expert_parallel))
        frozen, kind = _as_params(params)
        if type(flag) is not bool:
            msg = f"expert_parallel must be True or False, got {quote(flag)}"
            raise LayoutError(msg)
        if cls is not ModulePlan:
            kind = None  # a subclass's plans are its own
        if kind is not None and (plan := kind.plans[expert_parallel]) is not None:
            return plan  # type: ignore[return-value]  # cls is ModulePlan
        self = object.__new__(cls)
        object.__setattr__(self, "params", frozen)
        object.__setattr__(self, "expert_parallel", expert_parallel)
        if kind is not None:
            kind.plans[expert_parallel] = self
        return self

    def __reduce__(self) -> tuple[Callable[..., ModulePlan], tuple[ModuleParams, bool]]:
        return (_module_plan, (self.params, self.expert_parallel))


def _module_plan(params: ModuleParams, expert_parallel: bool) -> ModulePlan:
    """``ModulePlan(params, expert_parallel=...)``: how a pickled one is made again."""
    return ModulePlan(params, expert_parallel=expert_parallel)


def _is_module_fqn(name: object) -> bool:
    """A module FQN: ``""`` (the root) or dotted segments (``layers.*.attention``)."""
    return type(name) is str and (not name or _segments_ok(name))


def _check_modules(modules: Iterable[tuple[str, ModulePlan]]) -> None:
    """Every key of ``modules`` (a plan's modules' items) a module FQN and every value a
    ``ModulePlan``.

    Raises:
        LayoutError: naming the first key or value that is not.
    """
    for fqn, spec in modules:
        if not _is_module_fqn(fqn):
            msg = (
                f"module FQN {quote(fqn)} must be a dotted name ('' for the root module; a "
                "segment may be '*', matching any one segment)"
            )
            raise LayoutError(msg, fqn=_shown_key(fqn))
        spec_obj: object = spec
        if not isinstance(spec_obj, ModulePlan):
            msg = (
                f"module {quote(fqn)}: {quote(spec_obj)} is not a ModulePlan; wrap its params "
                "in ModulePlan(...)"
            )
            raise LayoutError(msg, fqn=fqn)


def _as_modules(modules: Mapping[str, ModulePlan]) -> FrozenMap[str, ModulePlan]:
    raw: object = modules
    if type(raw) is dict or type(raw) is FrozenMap:
        return FrozenMap(modules)  # checked with the plan's index (_index_of), at C speed
    if not isinstance(raw, Mapping):
        msg = f"a plan's modules must map module FQNs to ModulePlan, got {quote(raw)}"
        raise LayoutError(msg)
    # Read once, checked, then copied: a lazily built mapping is read once.
    items = mapping_items(modules, "a plan's modules", "{'attn': ModulePlan(...)}")
    _check_modules(items)
    return frozen_map_of(dict(items))


@attrs.frozen
class _Index:
    """What ``build_table`` needs to know of a plan's modules, found when the plan is made.

    ``kinds`` holds each distinct module plan object once (a model's modules are of a
    few kinds, and equal module plans are one object); ``patterns`` says a module key or
    parameter path holds ``*``; ``nested`` says a module's FQN joined with a dotted path
    of its names another module of the plan (``moe`` with ``experts.w1`` and a module
    ``moe.experts``), so two of its entries may share an FQN.
    """

    kinds: tuple[ModulePlan, ...]
    patterns: bool
    nested: bool


_FEW_KINDS: Final = 64
"""At most this many distinct module plans are looked for among the known kinds."""


def _distinct(values: Collection[ModulePlan]) -> tuple[ModulePlan, ...]:
    """Each distinct object of ``values`` once (by identity), in one C-speed pass.

    Module plans made from plain dicts are the known kinds' (``_KNOWN`` holds them), so
    the set of the values' ids is usually a subset of theirs: each id is of an object
    alive in ``values`` or in ``_KNOWN``, so equal ids are one object.
    """
    ids = set(map(id, values))
    if len(ids) <= _FEW_KINDS:
        known = {
            id(p): p for kinds in _KNOWN.values() for k in kinds for p in k.plans if p is not None
        }
        if ids <= known.keys():
            return tuple(known[i] for i in ids)
    return tuple(dict(zip(map(id, values), values, strict=True)).values())


def _index_of(modules: dict[str, ModulePlan]) -> _Index:
    """The plan's index, its modules checked on the way: at C speed when every key is a
    plain module FQN (no ``*``) and every distinct value a ``ModulePlan``, else by
    ``_check_modules``.

    The FQNs but the root's (``""``), joined by dots, show an empty segment as ``..`` or
    a dot at either end.
    """
    keys_ok = not set(map(type, modules)) - {str}
    if not keys_ok:
        joined = ""
    elif "" in modules:
        joined = ".".join(filter(None, modules))
    else:
        joined = ".".join(modules)
    kinds = _distinct(modules.values())
    if not (
        keys_ok
        and WILDCARD not in joined
        and ".." not in joined
        and not joined.startswith(".")
        and not joined.endswith(".")
        and all(type(spec) is ModulePlan for spec in kinds)
    ):
        _check_modules(modules.items())  # raises, or passes keys with '*' and subclasses
    distinct = {id(spec.params): spec.params for spec in kinds}  # kinds hold them
    patterns = WILDCARD in joined or any(WILDCARD in "\0".join(p) for p in distinct.values())
    nested = not patterns and _nested(modules, joined, kinds)
    return _Index(kinds, patterns, nested)


def _nested(modules: dict[str, ModulePlan], joined: str, kinds: tuple[ModulePlan, ...]) -> bool:
    """Whether a module's FQN joined with a dotted path of its is another module's FQN.

    Such an FQN holds the first segment of the path as a whole segment after a dot (or
    is the path's head, under the root module), so a C-speed scan of ``joined`` (the
    FQNs but the root's, joined by dots) for each first segment comes first (skipped for
    a segment with a character ``joined`` lacks), and the exact check over the modules
    runs only when one is found.
    """
    heads_of: dict[int, tuple[ModuleParams, set[str]]] = {}
    for spec in kinds:
        params = spec.params
        dotted = {path[:i] for path in params for i, c in enumerate(path) if c == "."}
        if dotted:
            heads_of[id(params)] = (params, dotted)  # the entry holds params
    if not heads_of:
        return False

    def heads(spec: ModulePlan) -> set[str]:
        found = heads_of.get(id(spec.params))
        return found[1] if found is not None and found[0] is spec.params else set()

    root = modules.get("")
    if root is not None and any(head in modules for head in heads(root)):
        return True
    firsts = {head.partition(".")[0] for _, found in heads_of.values() for head in found}
    # A segment holding a character no module FQN holds is in none: one memchr-speed
    # test per character spares most scans for a whole segment.
    absent = {c for c in set().union(*firsts) if c not in joined}
    if not any(
        f".{first}." in joined or joined.endswith(f".{first}")
        for first in firsts
        if absent.isdisjoint(first)
    ):
        return False
    return any(
        f"{module}.{head}" in modules
        for module, spec in modules.items()
        if module
        for head in heads(spec)
    )


def as_pairs(
    pairs: Iterable[Iterable[str]], arg: str = "tied_pairs"
) -> tuple[tuple[str, str], ...]:
    """``pairs`` as a tuple of FQN pairs, each checked to be two non-empty strings (plain
    ``str``: a subclass's text is taken).

    Every pair is read and checked before anything is done with them, so a caller gets
    all of them or an error.

    Raises:
        LayoutError: naming ``arg``: a bare string, something not iterable or that
            raises while it is read, or a pair that is not two non-empty strings.
    """
    example = "('emb.weight', 'head.weight')"
    out: list[tuple[str, str]] = []
    for pair in as_items(pairs, arg, f"[{example}]"):
        raw: object = plain_str(pair)  # type: ignore[arg-type]  # any object: kept as it is
        items: tuple[object, ...]
        if isinstance(raw, str) or not isinstance(raw, Iterable):
            items = (raw,)
        else:
            try:
                items = tuple(islice(raw, 3))  # more than two is refused unread
            except Exception as e:
                msg = f"{arg}: a tied pair could not be read ({quote(e)}); give {example}"
                raise LayoutError(msg) from e
        # a str subclass's own __hash__, __eq__ or __len__ never runs
        names = [plain_str(x) for x in items]  # type: ignore[arg-type]  # kept unless str
        if len(names) != 2 or not all(type(x) is str and x for x in names):
            msg = f"{arg}: a tied pair is two parameter FQNs, got {quote(raw)}; give {example}"
            raise LayoutError(msg)
        out.append((names[0], names[1]))
    return tuple(out)


def _as_pairs(pairs: Iterable[Iterable[str]]) -> tuple[tuple[str, str], ...]:
    return as_pairs(pairs)


def _as_vocabulary(axes: Iterable[AxisLike]) -> tuple[AxisName, ...]:
    return as_axes(axes, "mesh_axes")


def _check_vocabulary(
    _: object, __: attrs.Attribute[tuple[AxisName, ...]], value: tuple[AxisName, ...]
) -> None:
    check_distinct_axes(value, "mesh_axes")


@attrs.frozen(cache_hash=True)
class ShardingPlan:
    """A whole model's plan: module plans by module FQN, the mesh's axis names, tied pairs.

    ``mesh_axes`` is the run's axis vocabulary as the planner knew it; ``tied_pairs`` are
    pairs of parameter FQNs sharing storage (embedding and LM head).

    Module keys and parameter keys may hold ``*`` segments, each matching exactly one
    dotted segment (``{"layers.*.attention": ModulePlan({"wq.weight": ...})}``); such a
    plan is resolved against the model's FQNs (``build_table(..., fqns=...)``), the most
    specific key winning for each.
    """

    modules: FrozenMap[str, ModulePlan] = attrs.field(converter=_as_modules, **REQUIRED)
    mesh_axes: tuple[AxisName, ...] = attrs.field(
        kw_only=True, converter=_as_vocabulary, validator=_check_vocabulary, **REQUIRED
    )
    tied_pairs: tuple[tuple[str, str], ...] = attrs.field(
        default=(), kw_only=True, converter=_as_pairs
    )
    _index: _Index = attrs.field(init=False, eq=False, repr=False)

    def __attrs_pre_init__(
        self,
        modules: Mapping[str, ModulePlan],
        *,
        mesh_axes: Iterable[AxisLike],
        tied_pairs: Iterable[Iterable[str]],
    ) -> None:
        check_init(self, "modules", (modules, mesh_axes, tied_pairs))

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_index", _index_of(self.modules._items))

    def __reduce__(
        self,
    ) -> tuple[
        Callable[..., ShardingPlan],
        tuple[
            type[ShardingPlan],
            FrozenMap[str, ModulePlan],
            tuple[str, ...],
            tuple[tuple[str, str], ...],
        ],
    ]:
        # By its arguments: what the plan found of its modules is found again when it is
        # made again (pickles and copies carry no derived state).
        names = tuple(a.name for a in self.mesh_axes)
        return (_sharding_plan, (type(self), self.modules, names, self.tied_pairs))

    def __setstate__(self, state: object) -> None:
        # A plan pickled before plans pickled by their arguments holds its fields by name
        # (attrs' state): it is made again from them, checked, with its modules indexed.
        fields = state if isinstance(state, Mapping) else {}
        if not {"modules", "mesh_axes", "tied_pairs"} <= fields.keys():
            msg = (
                f"a pickled ShardingPlan holds {quote(state)}, not its modules, mesh_axes and "
                "tied_pairs; pickle the plan again, or save it with plan_to_json"
            )
            raise LayoutError(msg)
        made = ShardingPlan(
            fields["modules"], mesh_axes=fields["mesh_axes"], tied_pairs=fields["tied_pairs"]
        )
        for cls in ShardingPlan.__mro__:  # every slot the new plan filled, attrs' own too
            for name in getattr(cls, "__slots__", ()):
                if name != "__weakref__" and hasattr(made, name):
                    object.__setattr__(self, name, getattr(made, name))

    @property
    def has_patterns(self) -> bool:
        """Whether a module key or parameter key holds ``*`` (``build_table`` then needs
        the model's FQNs, ``fqns=``)."""
        return self._index.patterns

    def named_placements(self) -> Iterator[tuple[str, ModulePlan, NamedPlacements]]:
        """Every parameter of the plan as ``(fqn, module plan, named placements)``."""
        for module, spec in self.modules.items():
            for path, named in spec.params.items():
                yield param_fqn(module, path), spec, named


def _sharding_plan(
    cls: type[ShardingPlan],
    modules: FrozenMap[str, ModulePlan],
    mesh_axes: tuple[str, ...],
    tied_pairs: tuple[tuple[str, str], ...],
) -> ShardingPlan:
    """``cls(modules, mesh_axes=..., tied_pairs=...)``: how a pickled plan is made again."""
    return cls(modules, mesh_axes=mesh_axes, tied_pairs=tied_pairs)
