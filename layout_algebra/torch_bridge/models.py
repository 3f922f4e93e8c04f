"""Whole models: ``distribute`` a table onto one, ``table_from_module`` reads it back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from layout_algebra._args import mapping_items, plain_str
from layout_algebra._text import quote
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike
from layout_algebra.errors import BindError, LayoutError, OwnedAxisError
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.placements import (
    Partial,
    Placement,
    Replicate,
    StridedShard,
    format_placement,
)
from layout_algebra.plan import param_fqn
from layout_algebra.torch_bridge._checks import (
    check_meshes,
    check_module,
    check_table,
    check_type,
    owned_names,
    refuse_spmd_local,
    spmd_local,
)
from layout_algebra.torch_bridge._walk import named_modules, named_parameters
from layout_algebra.torch_bridge.binding import bind
from layout_algebra.torch_bridge.convert import from_torch
from layout_algebra.torch_bridge.param_map import Binding

__all__ = ["distribute", "table_from_module", "tied_pairs_from_module"]

_PLAIN: Final = SourceLayout("dense", (), ())
"""The layout a plain parameter reads back as (see ``table_from_module``)."""

_HF_EXPERT_DIMS: Final = frozenset({"pp", "dp_replicate", "efsdp", "fsdp", "ep"})
"""The dims a DTensor over transformers' expert mesh can have: that mesh's
(``initialize_distributed_mesh``: ``pp, dp_replicate, efsdp, ep``), and ``fsdp``, which its
FSDP pairs with ``ep`` for a non-expert module its ep plan shards (its dense mesh is
``pp, dp_replicate, fsdp, tp``)."""
_EXPERT_AXIS: Final = "ep"


def distribute(
    module: nn.Module,
    table: ParamLayoutTable,
    meshes: Mapping[str, DeviceMesh],
    *,
    src_data_rank: int | None = 0,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> None:
    """Turn each parameter ``table`` mentions into a DTensor with its layout, in place.

    Each becomes an ``nn.Parameter`` wrapping ``distribute_tensor(param, slice,
    placements)`` with ``requires_grad`` kept. Every alias of a tied parameter is pointed
    at the one new Parameter, so tied parameters stay tied. Everything is checked (see
    ``bind``), every slot to replace found and every DTensor built before the first
    parameter is swapped: on any error the module is left untouched (should a module
    refuse a swap, the ones made are undone). Parameters with no source axes stay plain.

    ``table`` holds source layouts: FSDP's own sharding is ``fully_shard``'s to add, so a
    composed layout (``compose_fsdp``/``compose_table``: ``S``/``_S`` on an owned axis)
    is refused.

    Args:
        module: the model, its parameters plain tensors.
        table: the source layouts, by FQN.
        meshes: the device mesh of each role, as for ``bind``.
        src_data_rank: passed to ``distribute_tensor``: the rank whose values are
            scattered (``None``: every rank splits its own full tensor).
        owned: the axes FSDP and pipelining own, on which a source layout places
            nothing but ``R``.

    Raises:
        BindError: as ``bind``, an argument of the wrong type, a parameter that is
            already a DTensor, one that no module registers under a name torch can
            register again (a name with a dot), or a layout torch's ``distribute_tensor``
            refuses for the parameter (such as a ``_S`` over a dim that does not split
            evenly, with ``src_data_rank`` set).
        OwnedAxisError: a composed (FSDP) layout, naming the FQN and the owned axis.
    """
    check_module(module, "distribute(module=...)")
    check_table(table, "distribute(table=...)")
    checked = check_meshes(meshes, "distribute(meshes=...)")  # read once, bound below
    world = dist.get_world_size() if dist.is_initialized() else 2**31
    if src_data_rank is not None and (
        type(src_data_rank) is not int or not 0 <= src_data_rank < world
    ):
        check_type(
            src_data_rank,
            (),
            "distribute(src_data_rank=...)",
            f"a rank (an int from 0 to {world - 1}) or None",
            "pass 0, or None to have every rank split its own full tensor",
        )
    _check_source(table, owned_names(owned, "distribute(owned=...)"))
    bindings = bind(table, module, checked)
    moved: dict[nn.Parameter, Binding] = {}  # parameters hash by identity
    for param, binding in bindings.items():
        if isinstance(param, DTensor):
            msg = (
                f"{binding.fqn}: already a DTensor with placements {param.placements} on "
                f"{param.device_mesh}; distribute a model whose parameters are plain tensors"
            )
            raise BindError(msg, fqn=binding.fqn)
        if binding.mesh is not None:
            moved[param] = binding
    slots = _slots(module, moved)
    with torch.no_grad():
        new = {
            param: _distributed(param, binding, table[binding.fqn], src_data_rank)
            for param, binding in moved.items()
        }
    done: list[tuple[nn.Module, str, nn.Parameter]] = []
    try:
        for sub, name, old in slots:
            setattr(sub, name, new[old])
            done.append((sub, name, old))
    except Exception as e:
        for sub, name, old in reversed(done):
            setattr(sub, name, old)
        fqn = moved[slots[len(done)][2]].fqn
        msg = (
            f"{fqn}: its module refused the DTensor parameter ({quote(e)}); the model is "
            "left as it was; distribute a model whose modules accept new parameters"
        )
        raise BindError(msg, fqn=fqn) from e


def _check_source(table: ParamLayoutTable, owned: frozenset[str]) -> None:
    """Refuse a composed layout in ``table``: ``S``/``_S`` on an ``owned`` axis.

    Raises:
        OwnedAxisError: naming the first such entry's FQN, axis and placement.
    """
    for fqn, layout in table.items():
        for axis, p in zip(layout.axes, layout.placements, strict=True):
            if axis.name in owned and not isinstance(p, Replicate):
                shown = format_placement(p)
                msg = (
                    f"{fqn}: {layout} places {shown} on {axis.name!r}, an axis FSDP owns: a "
                    "composed (FSDP) layout, not a source layout; distribute the source "
                    "table (the one given to compose_table, or build_table's) and let "
                    "fully_shard add FSDP's sharding, or pass owned=... without that axis"
                )
                raise OwnedAxisError(msg, fqn=fqn, axis=axis.name, placement=shown)


def _slots(
    module: nn.Module, moved: Mapping[nn.Parameter, Binding]
) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """Where each parameter of ``moved`` is registered: every ``(module, name, it)``.

    Registrations are read with torch's own ``nn.Module.named_parameters``, not a class's
    override of it: an override may name a parameter no module registers.

    Raises:
        BindError: a parameter registered under a name torch cannot register again (a
            dotted or empty one: ``register_parameter`` refuses it), or registered in no
            module (a class whose ``named_parameters`` makes its own).
    """
    out: list[tuple[nn.Module, str, nn.Parameter]] = []
    found: set[nn.Parameter] = set()
    walked: set[nn.Module] = set()  # a module shared at two places has its slots once
    for path, sub in named_modules(module):
        if sub in walked:
            continue
        walked.add(sub)
        own = nn.Module.named_parameters(sub, recurse=False, remove_duplicate=False)
        for name, p in own:
            if p not in moved:
                continue
            if not name or "." in name:
                fqn = param_fqn(path, name)
                msg = (
                    f"{quote(fqn)}: module {quote(path)} registers a parameter as "
                    f"{quote(name)}, which torch cannot register again (register_parameter "
                    "refuses an empty or dotted name), so distribute cannot replace it; "
                    "register it under a plain name (a submodule for each dotted part)"
                )
                raise BindError(msg, fqn=fqn)
            out.append((sub, name, p))
            found.add(p)
    for param, binding in moved.items():
        if param not in found:
            msg = (
                f"{binding.fqn}: no module of the model registers this parameter (its class "
                "makes it in named_parameters), so distribute cannot replace it; register "
                "it on a module, or leave it out of the table"
            )
            raise BindError(msg, fqn=binding.fqn)
    return out


def _distributed(
    param: nn.Parameter, binding: Binding, layout: SourceLayout, src_data_rank: int | None
) -> nn.Parameter:
    """``param`` as a DTensor parameter with its binding's mesh and placements.

    Raises:
        BindError: torch's ``distribute_tensor`` refuses it, naming the FQN and layout.
    """
    assert binding.mesh is not None  # the caller distributes only those with a mesh
    try:
        local = distribute_tensor(
            param.detach(), binding.mesh, binding.placements, src_data_rank=src_data_rank
        )
    except Exception as e:
        fqn = binding.fqn
        why = quote(str(e)) if str(e) else type(e).__name__
        remedy = "check the layout against the parameter's shape (lint)"
        if any(isinstance(p, StridedShard) for p in layout.placements):
            remedy = (
                "torch scatters a _S placement only over a dim that splits evenly; pass "
                "src_data_rank=None (every rank splits its own full tensor), or " + remedy
            )
        msg = (
            f"{fqn}: torch's distribute_tensor refused {layout} for a parameter of shape "
            f"{tuple(param.shape)} ({why}); {remedy}"
        )
        raise BindError(msg, fqn=fqn) from e
    return nn.Parameter(local, requires_grad=param.requires_grad)


class _Roles:
    """The role of each DTensor mesh: by identity or equality, else by a matching slice."""

    def __init__(self, roles: dict[DeviceMesh, str], *, by_name: bool = False) -> None:
        self.roles = roles  # checked, the caller's read once (_check_roles)
        self.by_name = by_name  # no roles given: transformers' expert mesh known by its names
        self.found: dict[tuple[DeviceMesh, tuple[str, ...]], str] = {}  # by value

    def of(self, mesh: DeviceMesh, source: tuple[str, ...]) -> str:
        key = (mesh, source)
        found = self.found.get(key)
        if found is None:
            found = self.found[key] = self._find(mesh, source)
        return found

    def _find(self, mesh: DeviceMesh, source: tuple[str, ...]) -> str:
        role = self.roles.get(mesh)  # a dict finds a mesh by identity, then equality
        if role is not None:
            return role
        mine = mesh[source]
        for candidate, role in self.roles.items():
            names = candidate.mesh_dim_names or ()
            if all(a in names for a in source) and candidate[source] == mine:
                return role
        if (
            self.by_name
            and _EXPERT_AXIS in source
            and _HF_EXPERT_DIMS.issuperset(mesh.mesh_dim_names or ())
        ):
            return "expert"
        return "dense"


def table_from_module(
    module: nn.Module,
    *,
    roles: Mapping[DeviceMesh, str] | None = None,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> ParamLayoutTable:
    """The table of a model, read off its parameters: DTensors and plain tensors.

    A DTensor parameter's layout has the non-owned dims of its mesh as axes and the
    placements torch reports on them. Dims of owned axes (``dp_shard``, ...) are dropped:
    their sharding is FSDP's own (``Shard``/``_StridedShard`` after ``fully_shard``,
    ``Replicate`` for HSDP replication), never part of a source layout; a ``Partial``
    there is refused. A plain tensor reads back as a plain parameter,
    ``SourceLayout("dense", (), ())`` (what ``distribute`` leaves plain), and so does a
    DTensor all of whose mesh dims are owned (a plain parameter after ``fully_shard``).
    So the table of a model after ``distribute`` and after ``fully_shard`` is the same.
    Aliases of one Parameter form a tied group.

    A plain parameter's role is always ``"dense"``: it has no source axis, so no mesh can
    tell its role (a plain tensor has no mesh at all, and FSDP's mesh for it spans owned
    axes only, which the dense and expert meshes of one world often share). ``"dense"`` is
    also the role ``complete_default`` gives by default, so a table completed with plain
    layouts reads back equal; and the role of a layout with no axes decides no slice.

    Args:
        module: the model.
        roles: the role of each mesh. A DTensor's mesh gets the role of the mesh that is
            it (by identity, then equality) or, failing that, of the first mesh whose
            slice over the same source axes equals its own — so the meshes given to
            ``distribute`` can be passed back here. Otherwise the role is ``"dense"``.
            With no ``roles`` at all, transformers' own meshes
            (``initialize_distributed_mesh``: dense ``pp, dp_replicate, fsdp, tp``,
            expert ``pp, dp_replicate, efsdp, ep``) are known by their dim names: a
            DTensor over ``ep`` on a mesh without ``tp`` (or any dim transformers'
            meshes lack) is ``"expert"``.
        owned: the axes FSDP and pipelining own.

    Raises:
        BindError: an argument of the wrong type, or a module of ``module`` that holds
            one of its ancestors (a cycle of submodules, naming the path that closes it).
        LayoutError: a DTensor on a mesh without dim names, a torch placement with no
            equivalent, a ``Partial`` placement on an owned axis, or a plain tensor
            holding a spmd_types shard (torchtitan's default backend; naming the FQNs), or
            the model's ``named_parameters`` raised (the exception its ``__cause__``).
    """
    check_module(module, "table_from_module(module=...)")
    checked = {} if roles is None else _check_roles(roles)
    owned_axes = owned_names(owned, "table_from_module(owned=...)")
    role_of = _Roles(checked, by_name=roles is None)
    entries: dict[str, SourceLayout] = {}
    aliases: dict[nn.Parameter, list[str]] = {}  # each parameter's FQNs (hashed by identity)
    local: list[str] = []  # spmd_types shards, refused together
    for fqn, param in named_parameters(module):
        names = aliases.get(param)
        if names is not None:
            entries[fqn] = entries[names[0]]
            names.append(fqn)
            continue
        aliases[param] = [fqn]
        if spmd_local(param):
            local.append(fqn)
        entries[fqn] = _layout_of(fqn, param, owned_axes, role_of)
    refuse_spmd_local(local, "table_from_module")
    return ParamLayoutTable(entries, tied=[names for names in aliases.values() if len(names) > 1])


def _check_roles(roles: object) -> dict[DeviceMesh, str]:
    """``roles`` checked, its items read once into a new dict."""
    remedy = "pass e.g. {world_mesh: 'dense', expert_mesh: 'expert'}"
    arg = "table_from_module(roles=...)"
    check_type(roles, Mapping, arg, "a mapping of DeviceMesh to mesh role (str)", remedy)
    assert isinstance(roles, Mapping)
    out: dict[DeviceMesh, str] = {}
    for mesh, role in mapping_items(roles, arg, "{world_mesh: 'dense'}", error=BindError):
        check_type(mesh, DeviceMesh, f"{arg} key", "a DeviceMesh", remedy)
        check_type(role, str, f"{arg}[{mesh}]", "a mesh role (str)", remedy)
        out[mesh] = plain_str(role)
    return out


def _layout_of(
    fqn: str, param: nn.Parameter, owned: frozenset[str], role_of: _Roles
) -> SourceLayout:
    if not isinstance(param, DTensor):
        return _PLAIN
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
    if not axes:
        return _PLAIN
    source = tuple(axes)
    return SourceLayout(role_of.of(mesh, source), source, placements)


def tied_pairs_from_module(module: nn.Module) -> tuple[tuple[str, str], ...]:
    """Every pair of FQNs that name one ``nn.Parameter`` of ``module``: its tied pairs.

    FQNs are those of ``module.named_parameters(remove_duplicate=False)``, so every alias
    is seen; a parameter named ``k`` times gives its ``k * (k - 1) / 2`` pairs. Each pair
    is in the module's order (the first-named FQN first), and so are the pairs. The
    result is what ``ShardingPlan(..., tied_pairs=...)`` takes.

    >>> from torch import nn
    >>> model = nn.ModuleDict({"emb": nn.Embedding(8, 4), "head": nn.Linear(4, 8)})
    >>> model["head"].weight = model["emb"].weight
    >>> tied_pairs_from_module(model)
    (('emb.weight', 'head.weight'),)

    Raises:
        BindError: ``module`` is not an ``nn.Module``, or a module of it holds one of its
            ancestors (a cycle of submodules, naming the path that closes it).
        LayoutError: the model's ``named_parameters`` raised (the exception its
            ``__cause__``).
    """
    check_module(module, "tied_pairs_from_module(module=...)")
    aliases: dict[nn.Parameter, list[str]] = {}  # each parameter's FQNs (hashed by identity)
    for fqn, param in named_parameters(module):
        aliases.setdefault(param, []).append(fqn)
    return tuple(
        (names[i], later)
        for names in aliases.values()
        for i in range(len(names))
        for later in names[i + 1 :]
    )
