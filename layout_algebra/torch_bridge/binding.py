"""Bindings of a table to a live model: ``bind``, ``default_binding``, ``managed_bindings``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, count, repeat
from operator import attrgetter, is_not, lt, not_
from typing import Final, cast

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from layout_algebra._frozen import items_copy
from layout_algebra._text import clip, did_you_mean, quote, some_of
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.placements import Placement, Replicate, Shard, StridedShard, format_placement
from layout_algebra.torch_bridge._checks import (
    check_meshes,
    check_module,
    check_table,
    check_type,
    owned_names,
    parameters,
)
from layout_algebra.torch_bridge._walk import (
    named_parameters,
    parameter_lists,
    state_dict_fqn,
)
from layout_algebra.torch_bridge.convert import from_torch, to_torch
from layout_algebra.torch_bridge.param_map import Binding, ParamBindings

__all__ = ["bind", "default_binding", "managed_bindings"]

_NDIM: Final = attrgetter("ndim")
"""A parameter's number of dims, for a pass of ``map`` over many."""

DEFAULT_FQN: Final = "<default>"
"""The ``fqn`` of a ``default_binding`` before ``managed_bindings`` names its parameter."""


class _Binder:
    """Layouts prepared: each its binding (mesh slice, torch placements) and the dims a
    parameter needs for it; each distinct (mesh role, axes) sliced once."""

    def __init__(self, meshes: Mapping[str, DeviceMesh]) -> None:
        self.meshes = meshes
        self.slices: dict[tuple[str, tuple[str, ...]], DeviceMesh] = {}

    def prepare(self, fqn: str, layout: SourceLayout) -> tuple[Binding, int]:
        """The binding of ``layout`` (named ``fqn``, the first parameter it binds) and the
        number of dims a parameter needs for it: one more than the highest dim it shards."""
        if not layout.axes:
            # a plain parameter (no source axes) stays a plain tensor: no mesh is needed
            return Binding(fqn, None, ()), 0
        mesh = self.meshes.get(layout.mesh)
        if mesh is None:
            given = [clip(role) for role in self.meshes]
            msg = (
                f"{fqn}: {layout} is on the {layout.mesh!r} mesh, but no mesh was given for "
                f"that role (given: {given}); pass meshes={{{layout.mesh!r}: mesh, ...}}"
            )
            raise BindError(msg, fqn=fqn)
        axes = tuple(a.name for a in layout.axes)
        placements = tuple(to_torch(p) for p in layout.placements)
        min_ndim = 0
        for p in layout.placements:
            if isinstance(p, Shard | StridedShard):
                min_ndim = max(min_ndim, p.dim + 1)
        key = (layout.mesh, axes)
        sub = self.slices.get(key)
        if sub is None:
            sub = self.slices[key] = self._new_slice(fqn, layout, mesh, axes)
        return Binding(fqn, sub, placements), min_ndim

    def _new_slice(
        self, fqn: str, layout: SourceLayout, mesh: DeviceMesh, axes: tuple[str, ...]
    ) -> DeviceMesh:
        names = mesh.mesh_dim_names
        if not names:
            axis, p = axes[0], format_placement(layout.placements[0])
            msg = (
                f"{fqn}: the {layout.mesh!r} mesh {mesh} has no dim names, so axis {axis!r} "
                f"({p}) of {layout} cannot be found on it; create the mesh with "
                "init_device_mesh(..., mesh_dim_names=(...))"
            )
            raise BindError(msg, fqn=fqn, axis=axis, placement=p)
        for axis, placement in zip(axes, layout.placements, strict=True):
            if axis not in names:
                p = format_placement(placement)
                msg = (
                    f"{fqn}: {p} on axis {axis!r} of {layout}, but the {layout.mesh!r} mesh "
                    f"has dims {list(names)}; build the table for this mesh or pass the "
                    f"mesh that has {axis!r}"
                )
                raise BindError(msg, fqn=fqn, axis=axis, placement=p)
        try:
            return mesh[axes]
        except (RuntimeError, KeyError, ValueError) as e:
            msg = (
                f"{fqn}: torch cannot slice the {layout.mesh!r} mesh (dims {list(names)}) "
                f"over {list(axes)} for {layout}: {e}; order the layout's axes as the mesh's"
            )
            raise BindError(msg, fqn=fqn, axis=axes[0]) from e


def _beyond_dims(
    fqn: str, placed: Iterable[tuple[str, Placement]], param: nn.Parameter, remedy: str
) -> BindError | None:
    """The error for the first ``(axis, placement)`` of ``placed`` that shards a dim
    ``param`` lacks, ending with ``remedy``; ``None`` when every one fits."""
    ndim = param.ndim
    for axis, placement in placed:
        if isinstance(placement, Shard | StridedShard) and placement.dim >= ndim:
            p = format_placement(placement)
            msg = (
                f"{fqn}: {p} on axis {axis!r} shards dim {placement.dim}, but the parameter "
                f"has {ndim} dim{'s' if ndim != 1 else ''} (shape {tuple(param.shape)}); "
                f"{remedy}"
            )
            return BindError(msg, fqn=fqn, axis=axis, placement=p)
    return None


def _too_few_dims(fqn: str, layout: SourceLayout, param: nn.Parameter) -> BindError:
    """The error for ``param``, which lacks a dim ``layout`` shards."""
    placed = [(axis.name, p) for axis, p in zip(layout.axes, layout.placements, strict=True)]
    error = _beyond_dims(fqn, placed, param, f"shard a dim below {param.ndim} or declare R")
    assert error is not None  # the caller found a dim it lacks
    return error


def _unknown_fqn(fqn: str, module: nn.Module, names: Iterable[str]) -> BindError:
    buffers = {name for name, _ in module.named_buffers(remove_duplicate=False)}
    if fqn in buffers:
        msg = (
            f"{clip(fqn)}: is a buffer of {type(module).__name__}, not a parameter; tables "
            "lay out parameters only (torch's parallel styles leave buffers alone): remove "
            "it from the table or plan, or register it as an nn.Parameter"
        )
        return BindError(msg, fqn=fqn)
    msg = (
        f"{clip(fqn)}: unknown parameter FQN, {type(module).__name__} has no such parameter"
        f"{did_you_mean(fqn, names)}; fix the table's FQN or bind the module the table was "
        "built for"
    )
    return BindError(msg, fqn=fqn)


def _named_twice(fqn: str, module: nn.Module) -> BindError:
    msg = (
        f"{clip(fqn)}: two parameters of {type(module).__name__} have this FQN (a name "
        "registered behind torch's back, with a dot, or under an activation-checkpoint "
        "wrapper), so its layout cannot say which; give each parameter its own name"
    )
    return BindError(msg, fqn=fqn)


def _alias_conflict(
    first: str, first_layout: SourceLayout, fqn: str, layout: SourceLayout
) -> BindError:
    axis: str | None = None
    placement: str | None = None
    if first_layout.axes == layout.axes:
        for a, p, q in zip(layout.axes, first_layout.placements, layout.placements, strict=True):
            if p != q:
                axis, placement = a.name, format_placement(q)
                break
    msg = (
        f"{fqn}: tied parameter aliases have conflicting source layouts: {first} is "
        f"{first_layout} but {fqn} is {layout}, and both name one Parameter; give them one "
        "layout (merge_tied, or tie them in the plan's tied_pairs)"
    )
    return BindError(msg, fqn=fqn, axis=axis, placement=placement)


def _bindings(
    fqns: Sequence[str],
    params: list[nn.Parameter],
    layouts: Sequence[SourceLayout],
    binder: _Binder,
) -> list[Binding]:
    """The binding of the parameter at each position, from the layout at that position,
    one ``Binding`` shared by all parameters of a layout. Raises the error of the first
    position that has one: its layout cannot be bound (each layout is prepared at its
    first position), or its parameter lacks a dim its layout shards.

    Each step is a pass of builtins over whole lists: no Python code runs per parameter
    but a layout's hash, once.
    """
    # each distinct layout numbered in the order first met, and each position's number
    numbers: defaultdict[SourceLayout, int] = defaultdict(count().__next__)
    numbered = list(map(numbers.__getitem__, layouts))
    shared: list[Binding] = []
    needs: list[int] = []  # the dims a parameter needs, by layout number
    for number, layout in enumerate(numbers):
        first = numbered.index(number)
        try:
            binding, ndim = binder.prepare(fqns[first], layout)
        except BindError:
            # a parameter before it may lack a dim: that error comes first
            _check_dims(fqns[:first], params[:first], layouts[:first], numbered[:first], needs)
            raise
        shared.append(binding)
        needs.append(ndim)
    _check_dims(fqns, params, layouts, numbered, needs)
    return list(map(shared.__getitem__, numbered))


def _check_dims(
    fqns: Sequence[str],
    params: list[nn.Parameter],
    layouts: Sequence[SourceLayout],
    numbered: list[int],
    needs: list[int],
) -> None:
    """Raise for the first parameter with fewer dims than its layout needs: the
    parameter at ``at`` needs ``needs[numbered[at]]``."""
    if any(map(lt, map(_NDIM, params), map(needs.__getitem__, numbered))):
        lacking = list(map(lt, map(_NDIM, params), map(needs.__getitem__, numbered)))
        at = lacking.index(True)
        raise _too_few_dims(fqns[at], layouts[at], params[at])


def _matched(
    table: ParamLayoutTable, module: nn.Module, binder: _Binder
) -> tuple[Sequence[str], list[nn.Parameter], list[Binding]]:
    """The FQN, parameter and binding of each parameter of the walk of ``module`` whose
    FQN ``table`` mentions, in walk order; raises ``bind``'s errors of a walk against a
    table, the first in walk order first.

    The walk only lists names and parameters; they are matched to the table afterwards,
    a pass of builtins over whole lists at a time. A table built from the model lists
    its FQNs in the walk's order, so the two lists of names are equal and the table's
    own FQNs and layouts are the ones met.
    """
    names, params = parameter_lists(module)
    # tuples: a tuple of strings kept by the result drops out of the collector's walks
    fqns, walked = tuple(table), tuple(names)
    if walked == fqns:  # the table's strings are kept: the walk's are not
        return fqns, params, _bindings(fqns, params, tuple(table.values()), binder)

    unfound = items_copy(table)  # each entry until a parameter meets it
    layouts = list(map(unfound.pop, names, repeat(None)))
    if len(table) - len(unfound) == len(names):  # every name met an entry of its own
        met_fqns, met_params, met_layouts = walked, params, cast(list[SourceLayout], layouts)
    else:  # a name the table lacks, or one met again (its entry taken the first time)
        mentioned = list(map(is_not, layouts, repeat(None)))
        met_fqns = tuple(compress(names, mentioned))
        met_params = list(compress(params, mentioned))
        met_layouts = cast(list[SourceLayout], list(compress(layouts, mentioned)))
        unmet = compress(range(len(names)), map(not_, mentioned))
        again = [at for at in unmet if names[at] in table]
        if again:  # two parameters under one FQN: an earlier error comes first
            before = mentioned[: again[0]].count(True)
            _bindings(met_fqns[:before], met_params[:before], met_layouts[:before], binder)
            raise _named_twice(names[again[0]], module)
    bindings = _bindings(met_fqns, met_params, met_layouts, binder)
    if unfound:  # the table's first FQN no parameter met
        known = [fqn for fqn, _ in named_parameters(module)]
        raise _unknown_fqn(next(iter(unfound)), module, known)
    return met_fqns, met_params, bindings


def bind(
    table: ParamLayoutTable, module: nn.Module, meshes: Mapping[str, DeviceMesh]
) -> ParamBindings:
    """The binding of every parameter of ``module`` that ``table`` mentions.

    FQNs are resolved as ``module.named_parameters(remove_duplicate=False)`` gives them,
    so every alias of a tied parameter is seen. A parameter is bound once, under the first of its
    FQNs (in the module's order) that the table mentions; aliases the table does not
    mention change nothing, and parameters it does not mention at all get no binding
    (``managed_bindings`` completes them).
    Bindings of equal ``(mesh role, axes)`` share one ``DeviceMesh`` slice object. A plain
    parameter (a layout with no source axes, ``SourceLayout("dense", (), ())``) gets
    ``Binding(fqn, None, ())``: it stays a plain tensor until FSDP, and needs no mesh.

    Args:
        table: the source layout of each parameter, by FQN.
        module: the live model.
        meshes: the device mesh of each role (``SourceLayout.mesh``), e.g.
            ``{"dense": world, "expert": expert_mesh}``; each layout is bound to the
            slice ``mesh[axes]`` of its role's mesh.

    Raises:
        BindError: an argument of the wrong type, an FQN the module does not have (with
            a close name suggested; a buffer's FQN is named as a buffer), two parameters
            under one FQN, a role with no mesh, a mesh without dim names, an axis the
            mesh lacks, a shard dim beyond the parameter's dims, or two aliases of one
            Parameter with different layouts, or a module of ``module`` that holds one
            of its ancestors (a cycle of submodules, naming the path that closes it).
            Nothing is bound unless everything binds.
    """
    check_table(table, "bind(table=...)")
    check_module(module, "bind(module=...)")
    binder = _Binder(check_meshes(meshes, "bind(meshes=...)"))
    fqns, params, bindings = _matched(table, module, binder)

    def conflict(first: str, fqn: str) -> BindError:
        return _alias_conflict(first, table[first], fqn, table[fqn])

    return ParamBindings._shared(fqns, params, bindings, conflict)


def default_binding(mesh: DeviceMesh, *, owned: Iterable[AxisLike] = FSDP_OWNED_AXES) -> Binding:
    """All-``Replicate`` over the source axes of a named world mesh, on that slice.

    The layout of a parameter no table mentions: for a world mesh
    ``(dp_shard, ep, tp)`` it is ``[R, R]`` on ``mesh[("ep", "tp")]``. Its ``fqn`` is
    ``"<default>"`` until ``managed_bindings`` gives it a parameter's name.

    Raises:
        BindError: ``mesh`` is not a ``DeviceMesh`` or has no dim names, ``owned`` is not
            a collection of axis names, or every axis of the mesh is owned.
    """
    check_type(
        mesh,
        DeviceMesh,
        "default_binding(mesh=...)",
        "a DeviceMesh",
        "pass the world mesh, e.g. init_device_mesh('cuda', (2, 4), mesh_dim_names=(...))",
    )
    owned_axes = owned_names(owned, "default_binding(owned=...)")
    names = mesh.mesh_dim_names
    if not names:
        msg = (
            f"default binding: the mesh {mesh} has no dim names, so its FSDP-owned and "
            "source axes cannot be told apart; create it with "
            "init_device_mesh(..., mesh_dim_names=(...))"
        )
        raise BindError(msg)
    source = tuple(n for n in names if n not in owned_axes)
    if not source:
        msg = (
            f"default binding: every dim of the mesh {list(names)} is FSDP-owned, so there "
            "is no source axis to replicate over; give those parameters table entries or "
            "pass a mesh with a source axis"
        )
        raise BindError(msg, axis=names[0])
    replicate = to_torch(Replicate())
    return Binding(DEFAULT_FQN, mesh[source], (replicate,) * len(source))


def _managed_params(owner: nn.Module, ignored: set[nn.Parameter]) -> list[tuple[str, nn.Parameter]]:
    """The parameters ``fully_shard(owner)`` will manage, each once, with an FQN.

    As torch walks it: the owner and its submodules, not descending into a submodule
    already wrapped by ``fully_shard``; each module's own parameters, minus ignored ones.
    A parameter seen twice (tied) keeps its first FQN, in ``named_parameters`` order.
    (Parameters and modules hash by identity, as in torch's own walks.)
    """
    out: list[tuple[str, nn.Parameter]] = []
    seen_params: set[nn.Parameter] = set()
    seen_modules: set[nn.Module] = set()
    stack: list[tuple[str, nn.Module]] = [("", owner)]
    while stack:
        prefix, mod = stack.pop()
        if mod in seen_modules:
            continue
        seen_modules.add(mod)
        for name, param in mod.named_parameters(recurse=False):
            if param in ignored or param in seen_params:
                continue
            seen_params.add(param)
            out.append((f"{prefix}.{name}" if prefix else name, param))
        children = [
            (state_dict_fqn(f"{prefix}.{name}" if prefix else name), child)
            for name, child in mod.named_children()
            if not isinstance(child, FSDPModule) and child is not owner
        ]
        stack.extend(reversed(children))
    return out


def managed_bindings(
    bindings: Mapping[nn.Parameter, Binding],
    owner: nn.Module,
    *,
    default: Binding | None = None,
    ignored_params: Iterable[nn.Parameter] | None = None,
) -> ParamBindings:
    """The bindings of exactly the parameters one ``fully_shard(owner)`` call manages.

    That is the parameters of ``owner``'s subtree, minus those of submodules already
    wrapped by ``fully_shard`` (they belong to that nested unit) and minus
    ``ignored_params``, each once. A parameter ``bindings`` has is kept with its binding;
    one it lacks gets ``default`` under its FQN relative to ``owner``.

    Args:
        bindings: bindings by parameter identity, e.g. from ``bind``.
        owner: the module about to be passed to ``fully_shard``.
        default: the binding of parameters ``bindings`` lacks (see ``default_binding``).
        ignored_params: the parameters ``fully_shard`` will be told to ignore.

    Raises:
        BindError: an argument of the wrong type, a managed parameter with no binding
            and no ``default``, or a default that shards a dim the parameter lacks.
    """
    check_type(
        bindings,
        Mapping,
        "managed_bindings(bindings=...)",
        "a mapping of nn.Parameter to Binding",
        "pass what bind returned",
    )
    check_module(owner, "managed_bindings(owner=...)")
    if default is not None:
        check_type(
            default,
            Binding,
            "managed_bindings(default=...)",
            "a Binding or None",
            "pass default_binding(world_mesh)",
        )
    ignored: set[nn.Parameter] = set()
    if ignored_params is not None:
        ignored = set(parameters(ignored_params, "managed_bindings(ignored_params=...)"))
    managed = _managed_params(owner, ignored)
    pairs: list[tuple[nn.Parameter, Binding]] = []
    missing: list[str] = []
    for fqn, param in managed:
        try:
            binding = bindings.get(param)
        except LayoutError:
            raise
        except Exception as e:  # the caller's mapping failed to look the parameter up
            msg = (
                f"managed_bindings(bindings=...) could not be read as a mapping such as "
                f"bind's result: looking up {clip(fqn)} raised {quote(e)}"
            )
            raise BindError(msg, fqn=fqn) from e
        if binding is not None:
            check_type(
                binding,
                Binding,
                f"managed_bindings(bindings=...)[{fqn}]",
                "a Binding",
                "pass what bind returned",
            )
        else:
            if default is None:
                missing.append(fqn)
                continue
            _check_default_dims(fqn, default, param)
            binding = default.with_fqn(fqn)
        pairs.append((param, binding))
    if missing:
        msg = (
            f"{missing[0]}: managed by fully_shard({type(owner).__name__}) but has no "
            f"binding and no default was given ({len(missing)} such: {some_of(missing)}); add "
            "them to the table or pass default=default_binding(world_mesh)"
        )
        raise BindError(msg, fqn=missing[0])
    return ParamBindings(pairs)


def _check_default_dims(fqn: str, default: Binding, param: nn.Parameter) -> None:
    names = (default.mesh.mesh_dim_names or ()) if default.mesh is not None else ()
    placed = zip(names, (from_torch(p) for p in default.placements), strict=False)
    error = _beyond_dims(fqn, placed, param, "give it a table entry (the default binding)")
    if error is not None:
        raise error
