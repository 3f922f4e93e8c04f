"""The weak, identity-keyed map from live parameters to their bindings."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from layout_algebra.placements import format_placement
from layout_algebra.torch_bridge.convert import TorchPlacement, from_torch

__all__ = ["Binding", "ParamBindings"]


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
