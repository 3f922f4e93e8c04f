"""The weak, identity-keyed map from live parameters to their bindings."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat

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


class _Deaths:
    """The callback of each weak reference of one ``ParamBindings``: counts its collected
    parameters, so that ``len`` is one subtraction."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _: weakref.ref[nn.Parameter]) -> None:
        self.count += 1


def _firsts(
    fqns: Sequence[str],
    params: list[nn.Parameter],
    bindings: list[Binding],
    conflict: Callable[[str, str], Exception] | None,
) -> tuple[Sequence[str], list[nn.Parameter], list[Binding], dict[int, int]]:
    """The three lists with each parameter at its first position only, and the position
    of each by ``id``; a parameter given again with another ``Binding`` raises
    ``conflict(first_fqn, fqn)`` (with no ``conflict``, the first binding wins)."""
    index: dict[int, int] = {}
    kept: list[int] = []
    for at, param in enumerate(params):
        first = index.setdefault(id(param), len(kept))  # by identity, held weakly
        if first == len(kept):
            kept.append(at)
        elif conflict is not None and bindings[kept[first]] is not bindings[at]:
            raise conflict(fqns[kept[first]], fqns[at])
    return (
        [fqns[at] for at in kept],
        [params[at] for at in kept],
        [bindings[at] for at in kept],
        index,
    )


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


def _not_a_triple(shown: str) -> BindError:
    """The error for an item of ``ParamBindings.sharing``, shown as ``shown``."""
    msg = (
        "ParamBindings.sharing(items=...): each item must be an (fqn, nn.Parameter, "
        f"Binding) triple, got {shown}; pass (fqn, parameter, binding) for each parameter"
    )
    return BindError(msg)


class ParamBindings(Mapping[nn.Parameter, Binding]):
    """The ``Binding`` of each live parameter, keyed by identity and held weakly.

    A read-only mapping. Lookups compare parameters by identity, never with ``==``
    (which on tensors is elementwise). The mapping holds no strong reference to any
    parameter: once the model replaces one and it is collected, its entry disappears.
    Iteration yields the parameters still alive, in binding order.
    """

    # Each bound parameter has a position: its weak reference, FQN and binding sit there
    # in three lists, so the reference is the one object kept per parameter (each kept
    # object brings the collector's next walk of the whole heap nearer). ``_index`` maps
    # each parameter's id to its position; a position found is the parameter's only if
    # its reference gives back that very object, since a collected parameter's id may be
    # reused. A collected parameter's position stays, skipped, until the mapping goes.
    __slots__ = (
        "__weakref__",
        "_bindings",
        "_deaths",
        "_fqn_index",
        "_fqns",
        "_index",
        "_refs",
    )
    _refs: list[weakref.ref[nn.Parameter]]
    _fqns: Sequence[str]
    _bindings: list[Binding]
    """A parameter's own binding, or one shared by its layout under another FQN."""
    _index: dict[int, int]
    _deaths: _Deaths
    _fqn_index: dict[str, int] | None
    """Each live parameter's position by its FQN, made when first looked up."""

    def __init__(self, items: Iterable[tuple[nn.Parameter, Binding]] = ()) -> None:
        """Bindings for ``items``; the first binding of a parameter given twice wins.

        Raises:
            BindError: ``items`` is not an iterable of ``(nn.Parameter, Binding)`` pairs.
        """
        fqns: list[str] = []
        params: list[nn.Parameter] = []
        bindings: list[Binding] = []
        for param, binding in _pairs(items):
            fqns.append(binding.fqn)
            params.append(param)
            bindings.append(binding)
        self._fill(fqns, params, bindings, None)

    @classmethod
    def sharing(
        cls,
        items: Iterable[tuple[str, nn.Parameter, Binding]],
        conflict: Callable[[str, str], Exception],
    ) -> ParamBindings:
        """Bindings for ``items``: each parameter bound as its ``Binding``, under the FQN
        given beside it.

        One ``Binding`` may serve every parameter of one layout: a parameter's own,
        ``binding.with_fqn(fqn)``, is made when it is first read. A parameter given again
        (an alias) keeps its first FQN; given again with another ``Binding`` object, the
        exception ``conflict(first_fqn, fqn)`` is raised.

        Raises:
            BindError: ``items`` is not iterable, an item is not an ``(fqn, nn.Parameter,
                Binding)`` triple, or ``conflict`` is not callable.
        """
        raw: object = items
        if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
            msg = (
                "ParamBindings.sharing(items=...): must be an iterable of (fqn, "
                f"nn.Parameter, Binding) triples, got {kind(raw)} {quote(raw)}; pass a list "
                "of them"
            )
            raise BindError(msg)
        given: object = conflict
        if not callable(given):
            msg = (
                "ParamBindings.sharing(conflict=...): must be a function of the first FQN "
                f"and the alias's, got {kind(given)} {quote(given)}; pass e.g. "
                "lambda first, fqn: BindError(...)"
            )
            raise BindError(msg)
        fqns: list[str] = []
        params: list[nn.Parameter] = []
        bindings: list[Binding] = []
        triples: Iterable[tuple[object, object, object]] = items  # each checked below
        for item in triples:
            try:
                fqn, param, binding = item
            except (TypeError, ValueError):  # not three things
                raise _not_a_triple(f"{kind(item)} {quote(item)}") from None
            if not (
                isinstance(fqn, str)
                and isinstance(param, nn.Parameter)
                and isinstance(binding, Binding)
            ):
                raise _not_a_triple(f"({kind(fqn)}, {kind(param)}, {kind(binding)})")
            fqns.append(fqn)
            params.append(param)
            bindings.append(binding)
        return cls._shared(fqns, params, bindings, conflict)

    @classmethod
    def _shared(
        cls,
        fqns: Sequence[str],
        params: list[nn.Parameter],
        bindings: list[Binding],
        conflict: Callable[[str, str], Exception],
    ) -> ParamBindings:
        """``sharing`` of the items at each position of three lists already checked
        (``bind``'s), which the mapping may keep."""
        out = cls()
        out._fill(fqns, params, bindings, conflict)
        return out

    def _fill(
        self,
        fqns: Sequence[str],
        params: list[nn.Parameter],
        bindings: list[Binding],
        conflict: Callable[[str, str], Exception] | None,
    ) -> None:
        """Bind the parameter at each position of the lists, each once (see ``_firsts``)."""
        count = len(params)
        index = dict(zip(map(id, params), range(count), strict=True))  # by identity, held weakly
        if len(index) < count:  # a parameter given again: only its first position binds it
            fqns, params, bindings, index = _firsts(fqns, params, bindings, conflict)
        deaths = _Deaths()
        self._refs = list(map(weakref.ref, params, repeat(deaths)))
        self._fqns, self._bindings, self._index, self._deaths = fqns, bindings, index, deaths
        self._fqn_index = None

    def _binding(self, at: int) -> Binding:
        """The binding at ``at``, the parameter's own made from a shared one when first read."""
        binding, fqn = self._bindings[at], self._fqns[at]
        if binding.fqn != fqn:
            binding = self._bindings[at] = binding.with_fqn(fqn)
        return binding

    def _live(self) -> Iterator[tuple[int, nn.Parameter]]:
        """The position and parameter of each bound parameter still alive, in order."""
        for at, ref in enumerate(self._refs):
            param = ref()
            if param is not None:
                yield at, param

    def __getitem__(self, param: nn.Parameter) -> Binding:
        at = self._index.get(id(param))  # by identity: see the class comment
        if at is None or self._refs[at]() is not param:
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
        return self._binding(at)

    def __iter__(self) -> Iterator[nn.Parameter]:
        for ref in self._refs:
            param = ref()
            if param is not None:
                yield param

    def __len__(self) -> int:
        return len(self._refs) - self._deaths.count

    def __contains__(self, param: object) -> bool:
        at = self._index.get(id(param))  # by identity: see the class comment
        return at is not None and self._refs[at]() is param

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
            # positions never change, so the index never goes stale: a parameter
            # collected since is found dead at its position
            self._fqn_index = {self._fqns[at]: at for at, _ in self._live()}
        at = self._fqn_index.get(fqn)
        param = None if at is None else self._refs[at]()
        if at is None or param is None:
            close = did_you_mean(fqn, self._fqn_index)
            msg = (
                f"{clip(fqn)}: no live parameter is bound under this FQN{close}; bind the "
                "parameter first (a table entry), or look it up by the FQN it was bound under"
            )
            raise _MissingBinding(msg, fqn=fqn)
        return param, self._binding(at)

    def fqns(self) -> dict[str, Binding]:
        """Every binding of a live parameter, by the FQN it was bound under."""
        return {self._fqns[at]: self._binding(at) for at, _ in self._live()}
