"""The plan a parallelism planner hands over: named placements per parameter, per module.

``ShardingPlan`` maps module FQNs to ``ModulePlan``\\ s; a ``ModulePlan`` maps each
parameter path (relative to the module, may hold dots: ``experts.w1``) to its *named
placements*, ``{axis: placement}``. All three are frozen, hashable and equal by value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Final, Protocol, Self

import attrs

from layout_algebra._args import as_items, mapping_items, plain_str
from layout_algebra._frozen import (
    NOT_GIVEN,
    REQUIRED,
    FrozenMap,
    check_init,
    checked_call,
    frozen_map_of,
    intern,
    interned_get,
)
from layout_algebra._patterns import WILDCARD
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, axis_str, check_distinct_axes
from layout_algebra.errors import LayoutError
from layout_algebra.placements import Placement, is_placement

__all__ = ["ModulePlan", "NamedLike", "NamedPlacements", "ShardingPlan"]

NamedPlacements = FrozenMap[str, Placement]
"""One parameter's placements by axis name: ``{"tp": Shard(0), "ep": Shard(0)}``."""


class NamedLike(Protocol):
    """Named placements as a planner writes them: any mapping keyed by axis name.

    ``{"tp": Shard(0), "dp_shard": Replicate()}`` or ``{AxisName("tp"): Shard(0)}``. Only
    the read side of a mapping, so mypy accepts a dict literal that mixes placement classes
    or key types (a union of ``Mapping`` types would infer ``dict[str, object]`` for it).
    Anything that is not a ``Mapping`` is still rejected at run time.
    """

    def __len__(self) -> int: ...

    def items(self) -> ItemsView[AxisLike, Placement]: ...


def param_fqn(module: str, param: str) -> str:
    """The parameter's FQN: ``f"{module}.{param}"``, or just ``param`` for the root module."""
    return f"{module}.{param}" if module else param


_MAX_INTERNED_KEY: Final = 256
"""Named placements whose axis names total more characters than this are never interned."""


def as_named(param: str, named: NamedLike) -> NamedPlacements:
    """``named`` checked and frozen: the one normalisation of named placements.

    Axis keys become plain names (``AxisName("tp")`` and ``"tp"`` are one axis, named
    once), every value must be a placement; equal ones (in the same order) are one
    interned value, so a planner's new dict per parameter is looked up, not checked again.

    Raises:
        LayoutError: naming ``param`` (the parameter), the axis and what is wrong.
    """
    raw: object = named
    if type(raw) is dict or type(raw) is FrozenMap:
        # Items equal to ones already checked and interned are that value.
        try:
            found = interned_get((_NAMED, tuple(raw.items())))
        except TypeError:  # an unhashable value: the full check below reports it
            found = None
        if type(found) is FrozenMap:
            return found  # interned only as NamedPlacements
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
    frozen: NamedPlacements = frozen_map_of(out)
    if sum(map(len, out)) > _MAX_INTERNED_KEY:
        return frozen
    kept = intern((_NAMED, tuple(out.items())), frozen)
    return kept if type(kept) is FrozenMap else frozen


_NAMED: Final = "named placements"
"""The tag of named placements' keys in the interner."""


ModuleParams = FrozenMap[str, NamedPlacements]
"""A module's named placements by parameter path, frozen."""

_SEGMENT: Final = r"(?:[^.*\n]+|\*)"
_DOTTED: Final = rf"{_SEGMENT}(?:\.{_SEGMENT})*"
_PATHS: Final = re.compile(rf"{_DOTTED}(?:\n{_DOTTED})*")
"""Parameter paths joined by newlines: dotted segments, each a name or ``*`` alone."""


def _as_params(params: Mapping[str, NamedLike]) -> ModuleParams:
    """``params`` checked and frozen: each path (all at once, one by one only to name a
    bad one), and each named placements (``as_named``).

    Params are interned by their paths (in order), a few sorts for each: a model's
    modules are of a few sorts, so a planner's new dict for each module most often
    equals one of them, and is that value (``_known_params``).

    Raises:
        LayoutError: naming the path that is bad, or the parameter whose placements are.
    """
    raw: object = params
    if type(raw) is not dict and not isinstance(raw, Mapping):
        msg = (
            f"a module plan's params must map parameter paths to named placements, got {quote(raw)}"
        )
        raise LayoutError(msg)
    items = mapping_items(params, "a module plan's params", "{'wq.weight': {'tp': Shard(0)}}")
    paths = raw.keys() if type(raw) is dict else [path for path, _ in items]
    if not (set(map(type, paths)) <= {str} and _PATHS.fullmatch("\n".join(paths))):
        for path in paths:
            if not _is_path(path):
                msg = (
                    f"parameter path {quote(path)} must be a non-empty dotted name such as "
                    "'wq.weight' (a segment may be '*', matching any one segment)"
                )
                raise LayoutError(msg, fqn=_shown_key(path))
    frozen: ModuleParams = frozen_map_of({path: as_named(path, named) for path, named in items})
    if len(frozen) <= _MAX_INTERNED_PARAMS and sum(map(len, frozen)) <= _MAX_INTERNED_PATHS:
        sorts = intern((_PARAMS, *frozen), [])
        if type(sorts) is list and len(sorts) < _MAX_SORTS:
            sorts.append(({path: dict(named) for path, named in frozen.items()}, frozen))
    return frozen


def _known_params(params: dict[object, object]) -> ModuleParams | None:
    """The interned params equal to ``params`` (paths in the same order), or ``None``.

    The sort found moves first among those with its paths: modules of one sort come
    in runs (a layer's norms), so the next one compares with it first.
    """
    try:
        sorts = interned_get((_PARAMS, *params))
        if type(sorts) is list:
            for i, (plain, frozen) in enumerate(sorts):
                if params == plain:
                    if i:
                        sorts.insert(0, sorts.pop(i))
                    return frozen  # type: ignore[no-any-return]  # kept as ModuleParams
    except Exception:  # a key or value whose hash or == raises: the full check names it
        return None
    return None


_PARAMS: Final = "module params"
"""The tag of module params' paths in the interner: the few sorts of params with them."""
_MAX_SORTS: Final = 8
_MAX_INTERNED_PARAMS: Final = 64
_MAX_INTERNED_PATHS: Final = 4096
"""At most this many sorts of params per paths; params with more parameters, or paths
totalling more characters, are never interned."""


def _shown_key(key: object) -> str:
    """A mapping key for an error's ``.fqn``: itself when a string, else its quote."""
    return clip(key) if isinstance(key, str) else quote(key)


def _segments_ok(name: str) -> bool:
    """Non-empty dotted segments, each a name or ``*`` alone (``layers.*.wq``)."""
    return all(s and (s == WILDCARD or WILDCARD not in s) for s in name.split("."))


def _is_path(name: object) -> bool:
    """A parameter path: dotted segments (``wq.weight``, ``experts.w1``, ``*.weight``)."""
    return type(name) is str and bool(name) and _segments_ok(name)


@checked_call
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
        # Made here, written out: a planner makes one per module, and a second __init__
        # (object's) can change nothing.
        if params is NOT_GIVEN:  # a LayoutError naming it, not Python's bare TypeError
            check_init(object.__new__(cls), "params", (params, expert_parallel))
        raw: object = params
        frozen = _known_params(raw) if type(raw) is dict else None
        if frozen is None:
            frozen = _as_params(params)
        flag: object = expert_parallel
        if type(flag) is not bool:
            msg = f"expert_parallel must be True or False, got {quote(flag)}"
            raise LayoutError(msg)
        self = object.__new__(cls)
        object.__setattr__(self, "params", frozen)
        object.__setattr__(self, "expert_parallel", expert_parallel)
        return self

    def __reduce__(
        self,
    ) -> tuple[Callable[..., ModulePlan], tuple[type[ModulePlan], ModuleParams, bool]]:
        return (_module_plan, (type(self), self.params, self.expert_parallel))


def _module_plan(cls: type[ModulePlan], params: ModuleParams, expert_parallel: bool) -> ModulePlan:
    """``cls(params, expert_parallel=...)``: how a pickled or copied one is made again."""
    return cls(params, expert_parallel=expert_parallel)


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
    """``modules`` checked and frozen: every key a module FQN and every value a
    ``ModulePlan`` (all at once, one by one only to name a bad one).

    Raises:
        LayoutError: naming the first key or value that is not.
    """
    raw: object = modules
    if not isinstance(raw, Mapping):
        msg = f"a plan's modules must map module FQNs to ModulePlan, got {quote(raw)}"
        raise LayoutError(msg)
    items = mapping_items(modules, "a plan's modules", "{'attn': ModulePlan(...)}")
    frozen: FrozenMap[str, ModulePlan] = frozen_map_of(
        dict(modules) if type(raw) is dict else dict(items)
    )
    keys, values = frozen.keys(), frozen.values()
    # Joined, the FQNs but the root's show an empty segment as '..' or a dot at either
    # end; a '*' is looked at one by one.
    joined = "\n".join(keys) if set(map(type, keys)) <= {str} else None
    if (
        joined is None
        or WILDCARD in joined
        or ".." in joined
        or "\n." in joined
        or ".\n" in joined
        or joined.startswith(".")
        or joined.endswith(".")
        or not set(map(type, values)) <= {ModulePlan}
    ):
        _check_modules(items)
    return frozen


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


@checked_call
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

    def __attrs_pre_init__(
        self,
        modules: Mapping[str, ModulePlan],
        *,
        mesh_axes: Iterable[AxisLike],
        tied_pairs: Iterable[Iterable[str]],
    ) -> None:
        check_init(self, "modules", (modules, mesh_axes, tied_pairs))

    @property
    def has_patterns(self) -> bool:
        """Whether a module key or parameter key holds ``*`` (``build_table`` then needs
        the model's FQNs, ``fqns=``)."""
        if WILDCARD in "\n".join(self.modules):
            return True
        return any(WILDCARD in "\n".join(spec.params) for spec in self.modules.values())

    def named_placements(self) -> Iterator[tuple[str, ModulePlan, NamedPlacements]]:
        """Every parameter of the plan as ``(fqn, module plan, named placements)``."""
        for module, spec in self.modules.items():
            for path, named in spec.params.items():
                yield param_fqn(module, path), spec, named
