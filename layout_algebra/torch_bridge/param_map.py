"""The weak, identity-keyed map from live parameters to their bindings."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from layout_algebra._text import clip, did_you_mean, quote
from layout_algebra.errors import BindError
from layout_algebra.placements import format_placement
from layout_algebra.torch_bridge._checks import check_type, kind
from layout_algebra.torch_bridge.convert import TorchPlacement, from_torch

__all__ = ["Binding", "ParamBindings"]


class _MissingBinding(BindError, KeyError):
    """A lookup in ``ParamBindings`` that finds no binding: a ``BindError`` and a ``KeyError``.

    It is a ``KeyError`` as a ``Mapping`` lookup must raise (so ``bindings.get(param)``
    and ``param in bindings`` work), and a ``BindError`` like every error of the bridge.
    """

    __str__ = BindError.__str__  # the message as given, not quoted as KeyError quotes it


def _check_fqn(value: object) -> None:
    check_type(value, str, "Binding(fqn=...)", "a str", "give the parameter's FQN")


def _check_mesh(value: object) -> None:
    if value is not None:
        check_type(
            value, DeviceMesh, "Binding(mesh=...)", "a DeviceMesh or None", "pass a mesh slice"
        )


def _as_placements(value: Iterable[TorchPlacement]) -> tuple[TorchPlacement, ...]:
    """``value`` as a tuple of torch placements, each checked."""
    remedy = "give one torch placement per mesh dim, e.g. (Shard(0),)"
    raw: object = value
    if isinstance(raw, str | bytes | TorchPlacement) or not isinstance(raw, Iterable):
        check_type(raw, (), "Binding(placements=...)", "a tuple of torch placements", remedy)
    out = tuple(value)
    for i, p in enumerate(out):
        check_type(
            p, TorchPlacement, f"Binding(placements=...) item {i}", "a torch placement", remedy
        )
    return out


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

    fqn: str = attrs.field(validator=lambda _, __, v: _check_fqn(v))
    mesh: DeviceMesh | None = attrs.field(validator=lambda _, __, v: _check_mesh(v))
    placements: tuple[TorchPlacement, ...] = attrs.field(converter=_as_placements)

    @placements.validator
    def _check_placements(self, _: attrs.Attribute[object], value: tuple[object, ...]) -> None:
        ndim = 0 if self.mesh is None else self.mesh.ndim
        if len(value) != ndim:
            where = "no mesh" if self.mesh is None else f"a {ndim}-dim mesh"
            msg = (
                f"Binding(placements=...): {self.fqn}: {len(value)} placements for {where}; "
                "give one torch placement per mesh dim (none when mesh is None)"
            )
            raise BindError(msg, fqn=self.fqn)

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
        """This binding under another name (same mesh object, same placements).

        Raises:
            BindError: ``fqn`` is not a str.
        """
        _check_fqn(fqn)
        return Binding(fqn, self.mesh, self.placements)


@attrs.frozen
class _Slot:
    """One layout prepared against the meshes: its slice, torch placements, dim needs."""

    mesh: DeviceMesh | None
    placements: tuple[TorchPlacement, ...]
    min_ndim: int
    """The parameter needs more dims than the highest dim any placement shards."""


class _ParamRef(weakref.ref[nn.Parameter]):
    """A weak reference to a bound parameter that carries its entry.

    Its FQN is kept in two parts, spelled when asked for: ``bind`` walks a module at a
    time, so a parameter found in its module's map keeps the module's prefix (shared by
    its siblings) and its own name (the module's own string), and no string is made per
    parameter; one bound under a whole FQN keeps that FQN as its tail and no head (one
    store fewer in the hot loop: an unset slot reads as ``""``).
    """

    __slots__ = ("entry", "head", "pid", "tail")
    pid: int
    head: str
    tail: str
    entry: _Slot | Binding
    """The slot of the parameter's layout until its ``Binding`` is made, then that."""

    @property
    def fqn(self) -> str:
        """The FQN the parameter is bound under."""
        return getattr(self, "head", "") + self.tail  # "" + fqn is fqn itself, not a copy


def _dropper(refs: dict[int, _ParamRef]) -> Callable[[_ParamRef], None]:
    # a closure over the dict, not over the mapping: a dropped mapping is not kept alive
    def drop(ref: _ParamRef) -> None:
        # runs while the parameter is being collected, before its id can be reused
        if refs.get(ref.pid) is ref:
            del refs[ref.pid]

    return drop


def _pairs(items: Iterable[tuple[nn.Parameter, Binding]]) -> Iterator[tuple[nn.Parameter, Binding]]:
    """Each ``(param, binding)`` pair of ``items``, checked as it comes.

    Raises:
        BindError: ``items`` is not iterable, or an item is not a pair of an
            ``nn.Parameter`` and a ``Binding``.
    """
    raw: object = items
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        msg = (
            f"ParamBindings(items=...): must be an iterable of (nn.Parameter, Binding) "
            f"pairs, got {kind(raw)} {quote(raw)}; pass e.g. bindings.items()"
        )
        raise BindError(msg)
    for i, item in enumerate(items):
        pair: object = item
        if isinstance(pair, tuple) and len(pair) == 2:
            param, binding = pair
            if isinstance(param, nn.Parameter) and isinstance(binding, Binding):
                yield param, binding
                continue
            shown = f"({kind(param)}, {kind(binding)})"
        else:
            shown = f"{kind(pair)} {quote(pair)}"
        msg = (
            f"ParamBindings(items=...): item {i} must be an (nn.Parameter, Binding) pair, "
            f"got {shown}"
        )
        raise BindError(msg)


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
    #
    # Measured against a read-only wrapper over torch.utils.weak.WeakIdKeyDictionary
    # (tests/bench/bench_bind.py, 100,000 parameters, a shuffled table, on 2 shared
    # cores): bind takes 244 ms filling this map, and the same walk, lookups and checks
    # take 342 ms filling the wrapper; dict(named_parameters) alone takes 155 ms. The
    # wrapper pays a Python-level WeakIdRef.__init__, __hash__ and __eq__ per parameter
    # and one value object beside each key; here the key is the C-level int id and the
    # weak reference itself carries the entry.
    __slots__ = ("__weakref__", "_drop", "_fqn_index", "_refs")

    def __init__(self, items: Iterable[tuple[nn.Parameter, Binding]] = ()) -> None:
        """Bindings for ``items``; the first binding of a parameter given twice wins.

        Raises:
            BindError: ``items`` is not an iterable of ``(nn.Parameter, Binding)`` pairs.
        """
        self._refs: dict[int, _ParamRef] = {}
        self._fqn_index: dict[str, int] | None = None
        self._drop = _dropper(self._refs)
        refs, drop = self._refs, self._drop
        for param, binding in _pairs(items):
            pid = id(param)
            if pid not in refs:
                ref = refs[pid] = _ParamRef(param, drop)
                ref.pid, ref.tail, ref.entry = pid, binding.fqn, binding

    @staticmethod
    def _binding(ref: _ParamRef) -> Binding:
        entry = ref.entry
        if isinstance(entry, Binding):
            return entry
        made = ref.entry = Binding(ref.fqn, entry.mesh, entry.placements)  # on first access
        return made

    def __getitem__(self, param: nn.Parameter) -> Binding:
        ref = self._refs.get(id(param))
        if ref is None or ref() is not param:
            raw: object = param
            shown = (
                f"this parameter (shape {tuple(param.shape)})"
                if isinstance(raw, nn.Parameter)
                else f"{kind(raw)} {quote(raw)}, which is not an nn.Parameter"
            )
            msg = (
                f"no binding for {shown}; give it a table entry before bind, or complete "
                "the bindings with managed_bindings(..., default=...)"
            )
            raise _MissingBinding(msg)
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
            BindError: no live parameter is bound under that name (also a ``KeyError``).
            BindError: ``fqn`` is not a str.
        """
        check_type(fqn, str, "ParamBindings.by_fqn(fqn=...)", "a str", "give a parameter's FQN")
        if self._fqn_index is None:
            # entries are only ever removed, never added, so the index never goes stale:
            # a removed entry's id is simply no longer found
            self._fqn_index = {ref.fqn: pid for pid, ref in self._refs.items()}
        pid = self._fqn_index.get(fqn)
        ref = None if pid is None else self._refs.get(pid)
        param = None if ref is None else ref()
        if ref is None or param is None:
            close = did_you_mean(fqn, self._fqn_index)
            msg = (
                f"{clip(fqn)}: no live parameter is bound under this FQN{close}; bind the "
                "parameter first (a table entry), or look it up by the FQN it was bound under"
            )
            raise _MissingBinding(msg, fqn=fqn)
        return param, self._binding(ref)

    def fqns(self) -> dict[str, Binding]:
        """Every binding of a live parameter, by the FQN it was bound under."""
        return {
            ref.fqn: self._binding(ref) for ref in list(self._refs.values()) if ref() is not None
        }
