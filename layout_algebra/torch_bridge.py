"""The bridge to torch: placements both ways, tables bound to a live model and meshes.

This is the only module of the package that imports torch. It maps a
``ParamLayoutTable`` onto a live ``nn.Module`` and its ``DeviceMesh`` objects:

- ``to_torch`` / ``from_torch`` convert placements losslessly (``StridedShard`` is
  torch's ``_StridedShard``);
- ``bind`` gives every parameter the table mentions a ``Binding``: the source sub-mesh
  (one slice object per distinct mesh and axes) and the torch placements;
- ``managed_bindings`` narrows bindings to what one ``fully_shard`` call manages;
- ``distribute`` turns the parameters into DTensors, and ``table_from_module`` reads the
  table back off such a model.

Bindings are held weakly, keyed by parameter identity: a ``ParamBindings`` never keeps a
parameter alive once the model has replaced it.
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final, TypeAlias, TypeGuard, assert_never, get_args

import attrs
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import placement_types as tpt

from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, axis_str
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.placements import (
    Partial,
    Placement,
    ReduceOp,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)

__all__ = [
    "Binding",
    "ParamBindings",
    "TorchPlacement",
    "bind",
    "default_binding",
    "distribute",
    "from_torch",
    "managed_bindings",
    "table_from_module",
    "to_torch",
]

TorchPlacement: TypeAlias = tpt.Placement
"""A placement as torch spells it (``torch.distributed.tensor.placement_types``)."""

DEFAULT_FQN: Final = "<default>"
"""The ``fqn`` of a ``default_binding`` before ``managed_bindings`` names its parameter."""

_REDUCE_OPS: Final[tuple[str, ...]] = get_args(ReduceOp)
_TO_TORCH: dict[Placement, TorchPlacement] = {}
_MAX_SUGGESTIONS: Final = 3
_MAX_LISTED: Final = 5
_END: Final[tuple[None, SourceLayout]] = (None, SourceLayout("<end>", (), ()))
"""Past the table's last entry: no FQN matches ``None``."""


# ---------------------------------------------------------------------------------------
# placements


def to_torch(p: Placement) -> TorchPlacement:
    """The torch placement that means what ``p`` means.

    ``Shard(0)`` gives torch ``Shard(0)``, ``Partial("max")`` gives ``Partial("max")``,
    ``StridedShard(0, split_factor=2)`` gives ``_StridedShard(0, split_factor=2)``.
    Equal placements give one shared torch object (torch placements are immutable).
    """
    found = _TO_TORCH.get(p)
    if found is not None:
        return found
    out: TorchPlacement
    match p:
        case Shard(dim):
            out = tpt.Shard(dim)
        case Replicate():
            out = tpt.Replicate()
        case Partial(op):
            out = tpt.Partial(op)
        case StridedShard(dim, split_factor=k):
            out = tpt._StridedShard(dim, split_factor=k)
        case _:
            assert_never(p)
    if len(_TO_TORCH) < 1024:  # a run uses a handful of placements; never grow unbounded
        _TO_TORCH[p] = out
    return out


def _is_reduce_op(op: str) -> TypeGuard[ReduceOp]:
    return op in _REDUCE_OPS


def from_torch(p: TorchPlacement) -> Placement:
    """The placement of this package that means what torch's ``p`` means.

    The inverse of ``to_torch``. Only the four exact torch kinds convert: a subclass
    (such as torch's internal ``_MaskPartial``) carries more than its base says, so it is
    refused rather than converted with a loss.

    Raises:
        LayoutError: ``p`` is of another kind, or a ``Partial`` with a reduce op this
            package does not know; the message names its type.
    """
    kind = type(p)
    if kind is tpt.Shard:
        assert isinstance(p, tpt.Shard)
        return Shard(int(p.dim))
    if kind is tpt.Replicate:
        return Replicate()
    if kind is tpt.Partial:
        assert isinstance(p, tpt.Partial)
        op = str(p.reduce_op)
        if not _is_reduce_op(op):
            msg = (
                f"torch placement {p!r} reduces with {op!r}, which has no layout_algebra "
                f"equivalent (known: {', '.join(_REDUCE_OPS)}); use one of those"
            )
            raise LayoutError(msg, placement=str(p))
        return Partial(op)
    if kind is tpt._StridedShard:
        assert isinstance(p, tpt._StridedShard)
        try:
            return StridedShard(int(p.dim), split_factor=int(p.split_factor))
        except LayoutError as e:
            msg = f"torch placement {p!r}: {e}"
            raise LayoutError(msg, placement=str(p)) from None
    msg = (
        f"torch placement {p!r} of type {kind.__module__}.{kind.__qualname__} has no "
        "layout_algebra equivalent; use Shard, Replicate, Partial or _StridedShard"
    )
    raise LayoutError(msg, placement=str(p))


# ---------------------------------------------------------------------------------------
# bindings


@attrs.frozen
class Binding:
    """Where one live parameter lives: its source sub-mesh and torch placements.

    ``fqn`` is the name the parameter was bound under (the table's FQN; relative to the
    owner for bindings completed by ``managed_bindings``). ``mesh`` is the slice of the
    role's mesh over the layout's axes, in their order; ``placements`` has one torch
    placement per dim of ``mesh``. A layout with no source axes (every axis of its mesh
    is FSDP-owned) binds to ``mesh=None`` and ``placements=()``: the parameter stays a
    plain tensor.
    """

    fqn: str
    mesh: DeviceMesh | None
    placements: tuple[TorchPlacement, ...]

    def __str__(self) -> str:
        if self.mesh is None:
            return f"{self.fqn}: no source axes"
        names = self.mesh.mesh_dim_names or ()
        inner = ", ".join(
            f"{n}={format_placement(from_torch(p))}"
            for n, p in zip(names, self.placements, strict=False)
        )
        return f"{self.fqn}: [{inner}] on {tuple(self.mesh.mesh.shape)} ranks"

    def with_fqn(self, fqn: str) -> Binding:
        """This binding under another name (same mesh object, same placements)."""
        return attrs.evolve(self, fqn=fqn)


@attrs.frozen
class _Slot:
    """One layout prepared against the meshes: its slice, torch placements, dim needs."""

    mesh: DeviceMesh | None
    placements: tuple[TorchPlacement, ...]
    min_ndim: int
    """The parameter needs more dims than the highest dim any placement shards."""


class _ParamRef(weakref.ref[nn.Parameter]):
    """A weak reference to a bound parameter that carries its entry."""

    __slots__ = ("binding", "fqn", "pid", "slot")
    pid: int
    fqn: str
    slot: _Slot | None
    binding: Binding | None


def _dropper(refs: dict[int, _ParamRef]) -> Callable[[_ParamRef], None]:
    # a closure over the dict, not over the mapping: a dropped mapping is not kept alive
    def drop(ref: _ParamRef) -> None:
        # runs while the parameter is being collected, before its id can be reused
        if refs.get(ref.pid) is ref:
            del refs[ref.pid]

    return drop


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Automatic garbage collection off for a bulk build, back on (if it was) after.

    A build that keeps one tracked object per parameter would otherwise trigger full
    collections that rescan the whole model heap, costing more than the build itself.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ParamBindings(Mapping[nn.Parameter, Binding]):
    """The ``Binding`` of each live parameter, keyed by identity and held weakly.

    A read-only mapping. Lookups compare parameters by identity, never with ``==``
    (which on tensors is elementwise). The mapping holds no strong reference to any
    parameter: once the model replaces one and it is collected, its entry disappears.
    Iteration yields the parameters still alive, in binding order.
    """

    # One weak reference per parameter is the only object made per parameter: it holds
    # the entry, and a ``Binding`` made by ``bind`` is built on first access from the
    # FQN and the shared slot of its layout.
    __slots__ = ("__weakref__", "_drop", "_fqn_index", "_refs")

    def __init__(self, items: Iterable[tuple[nn.Parameter, Binding]] = ()) -> None:
        """Bindings for ``items``; the first binding of a parameter given twice wins."""
        self._refs: dict[int, _ParamRef] = {}
        self._fqn_index: dict[str, int] | None = None
        self._drop = _dropper(self._refs)
        for param, binding in items:
            pid = id(param)
            if pid not in self._refs:
                ref = _ParamRef(param, self._drop)
                ref.pid, ref.fqn, ref.slot, ref.binding = pid, binding.fqn, None, binding
                self._refs[pid] = ref

    @staticmethod
    def _binding(ref: _ParamRef) -> Binding:
        made: Binding | None = getattr(ref, "binding", None)  # unset until first access
        if made is None:
            slot = ref.slot
            assert slot is not None  # an entry has a binding or the slot to build it
            made = ref.binding = Binding(ref.fqn, slot.mesh, slot.placements)
        return made

    def __getitem__(self, param: nn.Parameter) -> Binding:
        ref = self._refs.get(id(param))
        if ref is None or ref() is not param:
            msg = f"no binding for this parameter (shape {tuple(param.shape)})"
            raise KeyError(msg)
        return self._binding(ref)

    def __iter__(self) -> Iterator[nn.Parameter]:
        for ref in list(self._refs.values()):
            param = ref()
            if param is not None:
                yield param

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, param: object) -> bool:
        ref = self._refs.get(id(param))
        return ref is not None and ref() is param

    def __repr__(self) -> str:
        return f"ParamBindings(<{len(self)} parameters>)"

    def by_fqn(self, fqn: str) -> tuple[nn.Parameter, Binding]:
        """The live parameter bound under ``fqn``, and its binding.

        Raises:
            KeyError: no live parameter is bound under that name.
        """
        if self._fqn_index is None:
            # entries are only ever removed, never added, so the index never goes stale:
            # a removed entry's id is simply no longer found
            self._fqn_index = {ref.fqn: pid for pid, ref in self._refs.items()}
        pid = self._fqn_index.get(fqn)
        ref = None if pid is None else self._refs.get(pid)
        param = None if ref is None else ref()
        if ref is None or param is None:
            msg = f"{fqn}: no live parameter is bound under this FQN"
            raise KeyError(msg)
        return param, self._binding(ref)

    def fqns(self) -> dict[str, Binding]:
        """Every binding of a live parameter, by the FQN it was bound under."""
        return {
            ref.fqn: self._binding(ref) for ref in list(self._refs.values()) if ref() is not None
        }


# ---------------------------------------------------------------------------------------
# meshes


def _slice(mesh: DeviceMesh, axes: tuple[str, ...]) -> DeviceMesh:
    """The sub-mesh of ``mesh`` over ``axes``: the mesh itself when they are its names."""
    if mesh.mesh_dim_names == axes:
        return mesh
    if len(axes) == 1:
        return mesh[axes[0]]
    return mesh[axes]


class _Binder:
    """Layouts checked and sliced once each, whatever the number of parameters."""

    def __init__(self, meshes: Mapping[str, DeviceMesh]) -> None:
        self.meshes = meshes
        self.slices: dict[tuple[str, tuple[str, ...]], DeviceMesh] = {}
        self.by_value: dict[SourceLayout, _Slot] = {}
        # layouts are kept alive by the table for the whole call, so ids are stable
        self.by_id: dict[int, _Slot] = {}

    def slot(self, fqn: str, layout: SourceLayout) -> _Slot:
        found = self.by_id.get(id(layout))
        if found is None:
            found = self.by_value.get(layout)
            if found is None:
                found = self.by_value[layout] = self._prepare(fqn, layout)
            self.by_id[id(layout)] = found
        return found

    def _prepare(self, fqn: str, layout: SourceLayout) -> _Slot:
        mesh = self.meshes.get(layout.mesh)
        if mesh is None:
            given = sorted(self.meshes)
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
        if not axes:
            return _Slot(None, (), 0)
        key = (layout.mesh, axes)
        sub = self.slices.get(key)
        if sub is None:
            sub = self.slices[key] = self._new_slice(fqn, layout, mesh, axes)
        return _Slot(sub, placements, min_ndim)

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
            return _slice(mesh, axes)
        except (RuntimeError, KeyError, ValueError) as e:
            msg = (
                f"{fqn}: torch cannot slice the {layout.mesh!r} mesh (dims {list(names)}) "
                f"over {list(axes)} for {layout}: {e}; order the layout's axes as the mesh's"
            )
            raise BindError(msg, fqn=fqn, axis=axes[0]) from e

    @staticmethod
    def dim_error(fqn: str, layout: SourceLayout, param: nn.Parameter) -> BindError:
        ndim = param.ndim
        for axis, placement in zip(layout.axes, layout.placements, strict=True):
            if isinstance(placement, Shard | StridedShard) and placement.dim >= ndim:
                p = format_placement(placement)
                msg = (
                    f"{fqn}: {p} on axis {axis.name!r} shards dim {placement.dim}, but the "
                    f"parameter has {ndim} dim{'s' if ndim != 1 else ''} (shape "
                    f"{tuple(param.shape)}); shard a dim below {ndim} or declare R"
                )
                return BindError(msg, fqn=fqn, axis=axis.name, placement=p)
        msg = f"{fqn}: {layout} does not fit a parameter of shape {tuple(param.shape)}"
        return BindError(msg, fqn=fqn)


def _unknown_fqn(fqn: str, module: nn.Module, names: Iterable[str]) -> BindError:
    close = difflib.get_close_matches(fqn, list(names), n=_MAX_SUGGESTIONS)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    msg = (
        f"{fqn}: unknown parameter FQN, {type(module).__name__} has no such parameter"
        f"{hint}; fix the table's FQN or bind the module the table was built for"
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


def bind(
    table: ParamLayoutTable, module: nn.Module, meshes: Mapping[str, DeviceMesh]
) -> ParamBindings:
    """The binding of every parameter of ``module`` that ``table`` mentions.

    FQNs are resolved with ``module.named_parameters(remove_duplicate=False)``, so every
    alias of a tied parameter is seen. A parameter is bound once, under the first of its
    FQNs (in the module's order) that the table mentions; aliases the table does not
    mention change nothing, and parameters it does not mention at all get no binding
    (``managed_bindings`` completes them).
    Bindings of equal ``(mesh role, axes)`` share one ``DeviceMesh`` slice object.

    Args:
        table: the source layout of each parameter, by FQN.
        module: the live model.
        meshes: the device mesh of each role (``SourceLayout.mesh``), e.g.
            ``{"dense": world, "expert": expert_mesh}``; each layout is bound to the
            slice ``mesh[axes]`` of its role's mesh.

    Raises:
        BindError: an FQN the module does not have (with close names suggested), a role
            with no mesh, a mesh without dim names, an axis the mesh lacks, a shard dim
            beyond the parameter's dims, or two aliases of one Parameter with different
            layouts. Nothing is bound unless everything binds.
    """
    binder = _Binder(meshes)
    out = ParamBindings()
    # The hot loop, one pass over the module's parameters: a lookup or two each and one
    # weak reference holding the entry (the Binding is built on first access). Tables
    # usually list parameters in the module's order, so the table is walked alongside
    # and only an FQN out of step is looked up by hash.
    setdefault = out._refs.setdefault
    drop = out._drop
    get_slot = binder.by_id.get
    entries = iter(table.items())
    next_fqn, next_layout = next(entries, _END)
    by_fqn: dict[str, SourceLayout] | None = None
    found = 0
    with _gc_paused():
        for fqn, param in module.named_parameters(remove_duplicate=False):
            if fqn == next_fqn:
                layout = next_layout
                next_fqn, next_layout = next(entries, _END)
            else:
                if by_fqn is None:
                    by_fqn = dict(table.items())
                found_layout = by_fqn.get(fqn)
                if found_layout is None:
                    continue
                layout = found_layout
            found += 1
            slot = get_slot(id(layout))
            if slot is None:
                slot = binder.slot(fqn, layout)
            if slot.min_ndim and param.dim() < slot.min_ndim:
                raise binder.dim_error(fqn, layout, param)
            pid = id(param)
            ref = _ParamRef(param, drop)
            first = setdefault(pid, ref)
            if first is not ref:
                # an alias seen before; equal layouts share one slot, so another slot
                # means another layout
                if first.slot is not slot:
                    raise _alias_conflict(first.fqn, table[first.fqn], fqn, layout)
                continue
            ref.pid, ref.fqn, ref.slot = pid, fqn, slot
    if found < len(table):
        names = {fqn for fqn, _ in module.named_parameters(remove_duplicate=False)}
        unknown = next(fqn for fqn in table if fqn not in names)
        raise _unknown_fqn(unknown, module, names)
    return out


def default_binding(mesh: DeviceMesh, *, owned: Iterable[AxisLike] = FSDP_OWNED_AXES) -> Binding:
    """All-``Replicate`` over the source axes of a named world mesh, on that slice.

    The layout of a parameter no table mentions: for a world mesh
    ``(dp_shard, ep, tp)`` it is ``[R, R]`` on ``mesh[("ep", "tp")]``. Its ``fqn`` is
    ``"<default>"`` until ``managed_bindings`` gives it a parameter's name.

    Raises:
        BindError: the mesh has no dim names, or every one of its axes is owned.
    """
    names = mesh.mesh_dim_names
    if not names:
        msg = (
            f"default binding: the mesh {mesh} has no dim names, so its FSDP-owned and "
            "source axes cannot be told apart; create it with "
            "init_device_mesh(..., mesh_dim_names=(...))"
        )
        raise BindError(msg)
    owned_names = {axis_str(a) for a in owned}
    source = tuple(n for n in names if n not in owned_names)
    if not source:
        msg = (
            f"default binding: every dim of the mesh {list(names)} is FSDP-owned, so there "
            "is no source axis to replicate over; give those parameters table entries or "
            "pass a mesh with a source axis"
        )
        raise BindError(msg, axis=names[0])
    replicate = to_torch(Replicate())
    return Binding(DEFAULT_FQN, _slice(mesh, source), (replicate,) * len(source))


def _managed_params(owner: nn.Module, ignored: set[int]) -> list[tuple[str, nn.Parameter]]:
    """The parameters ``fully_shard(owner)`` will manage, each once, with an FQN.

    As torch walks it: the owner and its submodules, not descending into a submodule
    already wrapped by ``fully_shard``; each module's own parameters, minus ignored ones.
    A parameter seen twice (tied) keeps its first FQN, in ``named_parameters`` order.
    """
    out: list[tuple[str, nn.Parameter]] = []
    seen_params: set[int] = set()
    seen_modules: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", owner)]
    while stack:
        prefix, mod = stack.pop()
        if id(mod) in seen_modules:
            continue
        seen_modules.add(id(mod))
        for name, param in mod.named_parameters(recurse=False):
            pid = id(param)
            if pid in ignored or pid in seen_params:
                continue
            seen_params.add(pid)
            out.append((f"{prefix}.{name}" if prefix else name, param))
        children = [
            (f"{prefix}.{name}" if prefix else name, child)
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
        BindError: a managed parameter has no binding and there is no ``default``, or
            the default shards a dim the parameter does not have.
    """
    ignored = {id(p) for p in ignored_params} if ignored_params is not None else set()
    managed = _managed_params(owner, ignored)
    pairs: list[tuple[nn.Parameter, Binding]] = []
    missing: list[str] = []
    for fqn, param in managed:
        binding = bindings.get(param)
        if binding is None:
            if default is None:
                missing.append(fqn)
                continue
            _check_default_dims(fqn, default, param)
            binding = default.with_fqn(fqn)
        pairs.append((param, binding))
    if missing:
        shown = ", ".join(missing[:_MAX_LISTED])
        more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
        msg = (
            f"{missing[0]}: managed by fully_shard({type(owner).__name__}) but has no "
            f"binding and no default was given ({len(missing)} such: {shown}{more}); add "
            "them to the table or pass default=default_binding(world_mesh)"
        )
        raise BindError(msg, fqn=missing[0])
    return ParamBindings(pairs)


def _check_default_dims(fqn: str, default: Binding, param: nn.Parameter) -> None:
    names = (default.mesh.mesh_dim_names or ()) if default.mesh is not None else ()
    for axis, p in zip(names, default.placements, strict=False):
        if isinstance(p, tpt.Shard | tpt._StridedShard) and p.dim >= param.ndim:
            shown = format_placement(from_torch(p))
            msg = (
                f"{fqn}: the default binding puts {shown} on axis {axis!r}, but the "
                f"parameter has shape {tuple(param.shape)}; give it a table entry"
            )
            raise BindError(msg, fqn=fqn, axis=axis, placement=shown)


# ---------------------------------------------------------------------------------------
# models


def distribute(
    module: nn.Module,
    table: ParamLayoutTable,
    meshes: Mapping[str, DeviceMesh],
    *,
    src_data_rank: int | None = 0,
) -> None:
    """Turn each parameter ``table`` mentions into a DTensor with its layout, in place.

    Each becomes an ``nn.Parameter`` wrapping ``distribute_tensor(param, slice,
    placements)`` with ``requires_grad`` kept. Every alias of a tied parameter is pointed
    at the one new Parameter, so tied parameters stay tied. Everything is checked (see
    ``bind``) and every DTensor built before the first parameter is swapped: on any
    error the module is left untouched. Parameters with no source axes stay plain.

    Args:
        module: the model, its parameters plain tensors.
        table: the layouts, by FQN.
        meshes: the device mesh of each role, as for ``bind``.
        src_data_rank: passed to ``distribute_tensor``: the rank whose values are
            scattered (``None``: every rank splits its own full tensor).

    Raises:
        BindError: as ``bind``, or a parameter that is already a DTensor.
    """
    bindings = bind(table, module, meshes)
    for param, binding in bindings.items():
        if isinstance(param, DTensor):
            msg = (
                f"{binding.fqn}: already a DTensor with placements {param.placements} on "
                f"{param.device_mesh}; distribute a model whose parameters are plain tensors"
            )
            raise BindError(msg, fqn=binding.fqn)
    replaced: dict[int, nn.Parameter] = {}
    with torch.no_grad():
        for param, binding in bindings.items():
            if binding.mesh is None:
                continue
            local = distribute_tensor(
                param.detach(), binding.mesh, binding.placements, src_data_rank=src_data_rank
            )
            replaced[id(param)] = nn.Parameter(local, requires_grad=param.requires_grad)
    targets = [
        (fqn, replaced[id(p)])
        for fqn, p in module.named_parameters(remove_duplicate=False)
        if id(p) in replaced
    ]
    for fqn, new in targets:
        prefix, _, leaf = fqn.rpartition(".")
        setattr(module.get_submodule(prefix), leaf, new)


class _Roles:
    """The role of each DTensor mesh: by identity or equality, else by a matching slice."""

    def __init__(self, roles: Mapping[DeviceMesh, str] | None) -> None:
        self.roles = dict(roles or {})
        self.cache: dict[tuple[int, tuple[str, ...]], str] = {}
        self.keep: list[DeviceMesh] = []  # keeps cached ids valid for the call

    def of(self, mesh: DeviceMesh, source: tuple[str, ...]) -> str:
        key = (id(mesh), source)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self._find(mesh, source)
            self.keep.append(mesh)
        return found

    def _find(self, mesh: DeviceMesh, source: tuple[str, ...]) -> str:
        role = self.roles.get(mesh)  # a dict finds a mesh by identity, then equality
        if role is not None:
            return role
        if not source:
            return "dense"
        mine = _slice(mesh, source)
        for candidate, role in self.roles.items():
            names = candidate.mesh_dim_names or ()
            if all(a in names for a in source) and _slice(candidate, source) == mine:
                return role
        return "dense"


def table_from_module(
    module: nn.Module,
    *,
    roles: Mapping[DeviceMesh, str] | None = None,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> ParamLayoutTable:
    """The table of a model whose parameters are all DTensors, read off the DTensors.

    Each parameter's layout has the non-owned dims of its DTensor's mesh as axes and the
    placements torch reports on them. Dims of owned axes (``dp_shard``, ...) are dropped:
    their sharding is FSDP's own (``Shard``/``_StridedShard`` after ``fully_shard``,
    ``Replicate`` for HSDP replication), never part of a source layout; a ``Partial``
    there is refused. So the table of a model after ``distribute`` and after
    ``fully_shard`` is the same. Aliases of one Parameter form a tied group.

    Args:
        module: the model.
        roles: the role of each mesh. A DTensor's mesh gets the role of the mesh that is
            it (by identity, then equality) or, failing that, of the first mesh whose
            slice over the same source axes equals its own — so the meshes given to
            ``distribute`` can be passed back here. Otherwise the role is ``"dense"``.
        owned: the axes FSDP and pipelining own.

    Raises:
        LayoutError: a parameter that is not a DTensor, a mesh without dim names, a
            torch placement with no equivalent, or a ``Partial`` placement.
    """
    owned_names = {axis_str(a) for a in owned}
    role_of = _Roles(roles)
    entries: dict[str, SourceLayout] = {}
    aliases: dict[int, list[str]] = {}
    layouts: dict[int, SourceLayout] = {}
    interned: dict[SourceLayout, SourceLayout] = {}
    for fqn, param in module.named_parameters(remove_duplicate=False):
        pid = id(param)
        known = layouts.get(pid)
        if known is not None:
            entries[fqn] = known
            aliases[pid].append(fqn)
            continue
        layout = _layout_of(fqn, param, owned_names, role_of)
        layout = interned.setdefault(layout, layout)
        layouts[pid] = entries[fqn] = layout
        aliases[pid] = [fqn]
    tied = [group for group in aliases.values() if len(group) > 1]
    return ParamLayoutTable(entries, tied=tied)


def _layout_of(fqn: str, param: nn.Parameter, owned: set[str], role_of: _Roles) -> SourceLayout:
    if not isinstance(param, DTensor):
        msg = (
            f"{fqn}: a plain tensor of shape {tuple(param.shape)}, not a DTensor, so it has "
            "no layout to read; distribute the model first (torch_bridge.distribute) or "
            "build the table from the plan (build_table)"
        )
        raise LayoutError(msg, fqn=fqn)
    mesh = param.device_mesh
    names = mesh.mesh_dim_names
    if not names:
        msg = (
            f"{fqn}: its DTensor's mesh {mesh} has no dim names, so its axes are unknown; "
            "create the mesh with init_device_mesh(..., mesh_dim_names=(...))"
        )
        raise LayoutError(msg, fqn=fqn)
    axes: list[str] = []
    placements: list[Placement] = []
    for axis, tp in zip(names, param.placements, strict=True):
        try:
            p = from_torch(tp)
        except LayoutError as e:
            msg = f"{fqn}: on axis {axis!r}: {e}"
            raise LayoutError(msg, fqn=fqn, axis=axis, placement=e.placement) from None
        if axis in owned:
            if isinstance(p, Partial):
                shown = format_placement(p)
                msg = (
                    f"{fqn}: {shown} on the FSDP-owned axis {axis!r}: a parameter cannot be "
                    "a pending reduction; redistribute it to R or S(dim) first"
                )
                raise LayoutError(msg, fqn=fqn, axis=axis, placement=shown)
            continue
        axes.append(axis)
        placements.append(p)
    source = tuple(axes)
    return SourceLayout(role_of.of(mesh, source), source, placements)
