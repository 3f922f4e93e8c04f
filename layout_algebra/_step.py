"""The step as FSDP2 runs it: what one training step keeps and moves on every rank.

The one model of a step, which ``training_cost`` and ``lint`` call with the parameters
numbered by signature (``Params``). Three parts, each worked out once per signature and
spread over the ranks once:

- **the parameters** (``measure``): each distinct (composed layout, shape), per dim: the
  elements each rank keeps (``to_local()``, what the optimizer's states are shaped as) and
  the padded shard FSDP2 allocates for the parameter and its gradient: every rank
  ``ceil(rows / world)`` rows of its source-local tensor on FSDP's dim (10 rows over 4
  ranks keep 3, 3, 3, 1 and allocate 3 each);
- **the units** (``_Units``): which ``fully_shard`` call holds each parameter (the
  innermost unit whose module holds it; the root holds the rest), matched by the
  package's one pattern matcher, and each call's span in module order: worked out once
  per group of parameters alike in signature and in their first segments (``depth``);
- **FSDP2's buffers** (``_timeline``): the flat all-gather outputs and unsharded
  parameters ``FSDPParamGroup`` allocates, keeps and frees through forward and backward
  (its unshard, its copy-out, the flat output kept until the next unit's copy-out in
  forward, its post-forward reshard, its backward prefetch), followed with counts of
  unit signatures rather than bytes, so that a thousand alike layers are one state; the
  bytes of each distinct state are summed at the end.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar

import attrs

from layout_algebra._args import as_items
from layout_algebra._grouping import OncePerKey, first_positions, group_index, heads
from layout_algebra._patterns import WILDCARD, Matcher, Rule
from layout_algebra._ranks import (
    Chain,
    DimRead,
    Factor,
    Indices,
    RankSum,
    chain_of,
    chunk_lengths,
    read_dim,
    row_sum,
)
from layout_algebra._shards import check_dims, check_layout, size_of
from layout_algebra._text import clip, exact_bytes, human_bytes, quote, ranks_text, some_of
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import split_fsdp
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh, world_size
from layout_algebra.placements import Shard, StridedShard
from layout_algebra.shapes import DTYPE_BYTES, ParamShape

if TYPE_CHECKING:
    from layout_algebra.training import Training

__all__ = ["SCALAR_BYTES", "Params", "StepCost", "World", "cost", "depth", "measure"]

SCALAR_BYTES: Final = 4
"""An optimizer's scalar (``step``, ``mu_product``): a 0-d float32 tensor (torch's
default dtype), kept on the host unless ``fused`` or ``capturable``."""

_TOP: Final = 3
"""How many parameters a budget problem names."""

TP_AXIS, CP_AXIS, EP_AXIS = "tp", "cp", "ep"
"""The mesh axes tensor, context and expert parallelism run over (torchtitan's names)."""


# ---------------------------------------------------------------------------------------
# one (composed layout, shape)


@attrs.frozen
class Sharded:
    """What one (composed layout, shape) is on every rank: the elements each keeps (by
    dim, ``to_local()``), the padded shard FSDP2 allocates, FSDP's world size, whether
    HSDP all-reduces it and whether it is a DTensor before ``fully_shard`` (source axes)."""

    role: str
    kept: tuple[Factor, ...]
    padded: tuple[Factor, ...]
    world: int
    replicated: bool
    dtensor: bool


def measure(
    layout: SourceLayout,
    shape: ParamShape,
    mesh: Mesh,
    owned: frozenset[str],
    read: Callable[[int, Chain], DimRead] = read_dim,
) -> Sharded:
    """``layout`` of ``shape`` on ``mesh``, per dim: 10 rows under FSDP over 4 ranks keep
    3, 3, 3, 1 and allocate 3 each. ``read``: ``read_dim``, or one that remembers.

    FSDP2 chunks each rank's source-local tensor (the TP/EP shard) on its shard dim with
    ``torch.chunk`` and allocates the first chunk's size on every rank
    (``FSDPParam._init_sharded_param``: ``padded_sharded_size = chunks[0].size()``).

    Raises:
        LayoutError: a layout ``fully_shard`` does not make, an axis ``mesh`` lacks, a
            dim the parameter lacks.
    """
    for axis in layout.axes:
        size_of(mesh, axis, layout)
    check_dims(layout, shape.ndim, shape=shape.shape)
    parts = split_fsdp(layout, mesh, owned=owned)
    reads = [read(n, chain_of(layout, e, mesh)) for e, n in enumerate(shape.shape)]
    kept: list[Factor] = [(r.axes, r.lengths) for r in reads]
    padded = list(kept)
    world = 1
    if parts.shard is not None:
        dim, world = parts.shard_dim, mesh[parts.shard.name]
        source = read(shape.shape[dim], reads[dim].chain[1:])
        # by source rows held: a few distinct counts
        cuts = {h: chunk_lengths(h, world) for h in dict.fromkeys(source.lengths)}
        if len(cuts) == 1:  # every source piece alike: FSDP's index alone decides
            ((h, cut),) = cuts.items()
            kept[dim] = ((parts.shard.name,), cut)
            padded[dim] = ((), [-(-h // world)])
        else:
            by_index = [cuts[h] for h in source.lengths]
            kept[dim] = (reads[dim].axes, [c[f] for f in range(world) for c in by_index])
            padded[dim] = (source.axes, [-(-h // world) for h in source.lengths])
    return Sharded(
        layout.mesh,
        tuple(kept),
        tuple(padded),
        world,
        bool(parts.replicate),
        bool(parts.source.axes),
    )


def _at(mesh: Mesh, rank: int, factors: Iterable[Factor]) -> int:
    """The product of ``factors`` on global ``rank``."""
    where = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
    out = 1
    for axes, values in factors:
        i = 0
        for axis in axes:
            i = i * mesh[axis] + where[axis]
        out *= values[i]
    return out


_Key: TypeAlias = tuple[SourceLayout, ParamShape]
"""A parameter's signature: its composed layout, its shape and dtype."""

_Held: TypeAlias = int
"""A storage's signature, numbered, and whether it is trainable: ``number * 2 +
trainable``."""

_Instance: TypeAlias = tuple[int, tuple[str, ...]]
"""One ``fully_shard`` call: its unit's index in ``Training.units`` (``_ROOT`` for the
root) and what the ``*`` segments of its patterns matched."""

_ROOT: Final[_Instance] = (-1, ())


# ---------------------------------------------------------------------------------------
# the units

_T = TypeVar("_T")


def _by_module(fqn: str, known: dict[str, _T], extend: Callable[[_T, str], _T]) -> _T:
    """What ``fqn``'s module is, worked out once per module from its parent's:
    ``known`` holds the answers so far (``""``, the root, first), ``extend(parent's,
    module)`` gives a module's. Parameters of one module, and modules of one parent, share
    the work; a module's ancestors are walked up until one is known, never recursively."""
    module = fqn.rpartition(".")[0]
    found = known.get(module)
    if found is not None:
        return found
    missing: list[str] = []
    while found is None:
        missing.append(module)
        module = module.rpartition(".")[0]
        found = known.get(module)
    for module in reversed(missing):
        found = known[module] = extend(found, module)
    return found


class _Frozen:
    """Whether a parameter is frozen: a frozen pattern names it or a module holding it."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.matcher = Matcher(Rule(p, i) for i, p in enumerate(patterns))
        self.any = bool(patterns)
        self._by_module: dict[str, bool] = {"": False}

    def __call__(self, fqn: str) -> bool:
        if not self.any:
            return False
        held = _by_module(fqn, self._by_module, self._extend)
        return bool(self.matcher.every(fqn)) or held

    def _extend(self, outer: bool, module: str) -> bool:
        return bool(self.matcher.every(module)) or outer

    def check_used(self) -> None:
        """Every frozen pattern names a parameter or a module (a typo must not pass)."""
        unused = self.matcher.unused()
        if unused:
            msg = (
                f"Training(frozen=...): {quote(unused[0].key)} names no parameter or module; "
                "check the pattern against the model's FQNs"
            )
            raise LayoutError(msg)


class _Units:
    """Which ``fully_shard`` calls hold a parameter: every unit whose module holds it,
    outermost first (the innermost owns it), by the package's one pattern matcher."""

    def __init__(self, training: Training) -> None:
        rules: list[Rule[int]] = []
        self.names: list[str] = []
        self.reshard: list[bool | int] = []
        for u, item in enumerate(training.units):
            patterns: tuple[str, ...]
            if isinstance(item, str):
                patterns, reshard = (item,), training.reshard_after_forward
            else:
                patterns, reshard = item.modules, item.reshard_after_forward
            rules.extend(Rule(p, u) for p in patterns)
            self.names.append(str(item))
            self.reshard.append(reshard)
        self.matcher = Matcher(rules)
        self.modules: dict[_Instance, str] = {}  # each call's first module, for messages
        self.members: dict[_Instance, list[str]] = {}  # each call's modules, as met
        self._by_module: dict[str, tuple[_Instance, ...]] = {"": ()}

    def holding(self, fqn: str) -> tuple[_Instance, ...]:
        """The calls whose modules hold parameter ``fqn``, outermost first."""
        if not self.names:  # the root alone
            return ()
        return _by_module(fqn, self._by_module, self._extend)

    def _extend(self, outer: tuple[_Instance, ...], module: str) -> tuple[_Instance, ...]:
        """The calls holding ``module``: those holding its parent (``outer``), and the one
        naming ``module`` itself, if any."""
        indices = self.matcher.every(module)
        if not indices:
            return outer
        rules = [self.matcher.rule(i) for i in indices]
        if len(rules) > 1:
            named = " and ".join(quote(r.key) for r in rules)
            msg = (
                f"Training(units=...): module {quote(module)} is named by {named}; "
                "fully_shard wraps a module once: name it in one unit"
            )
            raise LayoutError(msg)
        rule = rules[0]
        segments = module.split(".")
        binding = tuple(s for s, p in zip(segments, rule.segments, strict=True) if p == WILDCARD)
        instance = (rule.value, binding)
        if outer and outer[-1] == instance:  # a module and its child in one call
            return outer
        self.modules.setdefault(instance, module)
        self.members.setdefault(instance, []).append(module)
        return (*outer, instance)

    def check_used(self) -> None:
        """Every unit pattern names a module holding a parameter (a typo must not pass)."""
        unused = self.matcher.unused()
        if unused:
            msg = (
                f"Training(units=...): {quote(unused[0].key)} names no module holding a "
                "parameter; check the pattern against the model's module FQNs"
            )
            raise LayoutError(msg)

    def name(self, instance: _Instance) -> str:
        """The call as a message names it: ``unit 'layers.*' (layers.3)``."""
        if instance == _ROOT:
            return "the root"
        module = self.modules.get(instance, "")
        return f"unit {quote(self.names[instance[0]])} ({clip(module, 80)})"


# ---------------------------------------------------------------------------------------
# FSDP2's buffers through the step

_FLAT, _UNSHARDED, _POST_FORWARD = 0, 1, 2
"""The buffers of a unit: its flat all-gather output, its unsharded parameters (the
copy-out's per-parameter outputs), and the copy an int ``reshard_after_forward`` keeps."""

_GRAD, _UNSHARDED_GRAD, _SCATTER = 3, 4, 5
"""A unit's gradients: its sharded gradients (made by its reduce-scatter, then kept),
the unsharded ones autograd makes in its backward, and the reduce-scatter input they
are copied into."""

_ACTS, _RECOMPUTE = 6, 7
"""What autograd keeps for a unit, from its forward to its backward, and what a
checkpointed unit saves again while its backward recomputes it: keyed by a class of
equal bytes rather than a signature."""

_HSDP: Final = -1
"""Not a buffer the timeline follows: the bytes HSDP all-reduces (``buffers``)."""

_FSDP_BUFFERS: Final = frozenset({_FLAT, _UNSHARDED, _POST_FORWARD})
"""The buffers ``"transient"`` counts: FSDP2's own."""

_SHARDED: Final = -1
"""A unit holding nothing but its sharded parameters."""

_Buffer: TypeAlias = tuple[int, int]
"""A buffer kind of one unit signature: ``(signature, kind)``."""


@attrs.frozen
class _Call:
    """One ``fully_shard`` call with parameters of its own: its signature (what it
    holds and how it reshards), its span of parameter positions in module order, how it
    reshards after forward (``False``, ``True`` or a group size), and whether backward
    reaches it (some trainable parameter runs at or before its end)."""

    signature: int
    start: int
    end: int
    reshard: bool | int
    fires: bool
    acts: int = -1
    """Its activations' class (``-1``: none)."""
    recompute: int = -1
    """What its backward saves again, by class (``-1``: none)."""

    def holds(self, other: _Call) -> bool:
        return self.start <= other.start and other.end <= self.end


class _Live:
    """The buffers alive, as counts by ``(signature, kind)``, and every distinct state
    they reach right after an allocation (a state the next one holds entirely is left
    out: its bytes are no more on any rank)."""

    def __init__(self) -> None:
        self.counts: dict[_Buffer, int] = {}
        self.states: list[dict[_Buffer, int]] = []
        self.seen: set[frozenset[tuple[_Buffer, int]]] = set()

    def alloc(self, signature: int, kind: int) -> None:
        key = (signature, kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        state = frozenset(self.counts.items())
        if state in self.seen:
            return
        self.seen.add(state)
        if self.states and all(self.counts.get(k, 0) >= n for k, n in self.states[-1].items()):
            self.states.pop()  # this one holds it and more
        self.states.append(dict(self.counts))

    def free(self, signature: int, kind: int) -> None:
        key = (signature, kind)
        n = self.counts[key] - 1
        if n:
            self.counts[key] = n
        else:
            del self.counts[key]


def _timeline(
    calls: Sequence[_Call], kept: Sequence[int] = ()
) -> tuple[Counter[int], list[dict[_Buffer, int]]]:
    """The all-gathers of each signature in one step, and the states of what it holds
    besides the model state (``_forward``, then ``_backward``); ``kept``: activation
    classes held through the whole step.

    Gradients are made in backward: the step is a steady one after
    ``zero_grad(set_to_none=True)`` (torch's default), which drops them."""
    live = _Live()
    for a in kept:
        live.alloc(a, _ACTS)
    gathers: Counter[int] = Counter()
    held = [_UNSHARDED] * len(calls)
    closed = _forward(calls, live, gathers, held)
    _backward(calls, closed, live, gathers, held)
    return gathers, live.states


def _forward(
    calls: Sequence[_Call], live: _Live, gathers: Counter[int], held: list[int]
) -> list[int]:
    """Forward, in module order (``FSDPParamGroup.pre_forward``/``post_forward``): a unit
    all-gathers into a flat buffer and copies out into its unsharded parameters while the
    previous unit's flat output is still held, then frees that one, and keeps its own flat
    output until the next unit's copy-out is done; after forward (once the units inside it are
    done) it frees its parameters (``True``), keeps them (``False``; the root by FSDP2's
    rule), or keeps a copy sharded over a smaller group (an int). Returns the
    post-forward order."""
    closed: list[int] = []

    def close(i: int) -> None:
        closed.append(i)
        call = calls[i]
        if call.reshard is False:
            return
        if call.reshard is not True:  # a smaller group's copy, cloned from the output
            live.alloc(call.signature, _POST_FORWARD)
            held[i] = _POST_FORWARD
        else:
            held[i] = _SHARDED
        live.free(call.signature, _UNSHARDED)

    stack: list[int] = []
    pending: int | None = None  # the flat output kept for the next copy-out, by signature
    for i in sorted(range(len(calls)), key=lambda i: (calls[i].start, -calls[i].end)):
        call = calls[i]
        while stack and calls[stack[-1]].end < call.start:
            close(stack.pop())
        live.alloc(call.signature, _FLAT)
        gathers[call.signature] += 1
        live.alloc(call.signature, _UNSHARDED)
        if call.acts >= 0:  # saved while the unit's forward runs, its parameters unsharded
            live.alloc(call.acts, _ACTS)
        # wait_for_unshard drops the previous flat output, but its local name for it
        # keeps it until the copy-out is done
        if pending is not None:
            live.free(pending, _FLAT)
        pending = call.signature
        stack.append(i)
    while stack:
        close(stack.pop())
    if pending is not None:  # the root's post-forward frees the last one
        live.free(pending, _FLAT)
    return closed


def _backward(
    calls: Sequence[_Call],
    closed: Sequence[int],
    live: _Live,
    gathers: Counter[int],
    held: list[int],
) -> None:
    """Backward, in the reverse of the post-forward order (``pre_backward``): a unit not
    still unsharded is all-gathered (unless prefetched), copied out and its flat output
    freed at once; then the unit before it in the post-forward order is prefetched
    (all-gathered, held until its own pre-backward); after backward (``post_backward``,
    once the units inside it are done) its parameters are freed. A unit backward never
    reaches (nothing trainable at or before it) is not gathered, unless prefetched.

    A unit's backward makes its unsharded gradients (recomputing its forward first when
    checkpointed); its post-backward copies them into the reduce-scatter input, drops
    them, and keeps the sharded gradients; autograd frees the unit's activations."""
    prefetched: set[int] = set()
    fired: set[int] = set()
    scattering: list[int] = []  # the reduce-scatter input FSDP2 still holds

    def gather(i: int) -> None:
        if held[i] != _UNSHARDED and i not in prefetched:
            live.alloc(calls[i].signature, _FLAT)
            gathers[calls[i].signature] += 1
            prefetched.add(i)

    def post(i: int) -> None:
        signature = calls[i].signature
        if i in prefetched:  # gathered ahead but never reached: freed at the end
            live.free(signature, _FLAT)
            prefetched.discard(i)
        if held[i] == _UNSHARDED:
            live.free(signature, _UNSHARDED)
        elif held[i] == _POST_FORWARD:
            live.free(signature, _POST_FORWARD)
        held[i] = _SHARDED
        _post_backward(calls[i], live, scattering, fired=i in fired)

    stack: list[int] = []
    for at in range(len(closed) - 1, -1, -1):
        i = closed[at]
        call = calls[i]
        while stack and not calls[stack[-1]].holds(call):
            post(stack.pop())
        if call.fires:
            if held[i] != _UNSHARDED:
                gather(i)
                live.alloc(call.signature, _UNSHARDED)
                live.free(call.signature, _FLAT)
                prefetched.discard(i)
                if held[i] == _POST_FORWARD:
                    live.free(call.signature, _POST_FORWARD)
                held[i] = _UNSHARDED
            if call.recompute >= 0:
                live.alloc(call.recompute, _RECOMPUTE)
            live.alloc(call.signature, _UNSHARDED_GRAD)
            fired.add(i)
            if at > 0:
                gather(closed[at - 1])
        stack.append(i)
    while stack:
        post(stack.pop())
    for signature in scattering:  # the root's finalize lets the last one go
        live.free(signature, _SCATTER)


def _post_backward(call: _Call, live: _Live, scattering: list[int], *, fired: bool) -> None:
    """After a unit's backward: the previous unit's reduce-scatter input let go (FSDP2
    keeps one, ``reduce_scatter_max_input_buffers=1``, until the next post-backward),
    this unit's unsharded gradients copied into its own and dropped, the sharded ones
    kept; its activations (and what its recompute saved) freed."""
    signature = call.signature
    if fired:
        while scattering:
            live.free(scattering.pop(), _SCATTER)
        live.alloc(signature, _SCATTER)
        live.free(signature, _UNSHARDED_GRAD)
        scattering.append(signature)
        live.alloc(signature, _GRAD)
        if call.recompute >= 0:
            live.free(call.recompute, _RECOMPUTE)
    if call.acts >= 0:
        live.free(call.acts, _ACTS)


def _peak(
    states: Sequence[Mapping[_Buffer, int]], bytes_of: Mapping[_Buffer, Sequence[int]], world: int
) -> list[int]:
    """Per rank, the most bytes any state holds: ranks whose buffers are alike in every
    kind form one class, and each state is summed once per class."""
    keys = sorted({k for state in states for k in state} & bytes_of.keys())
    if not keys:
        return [0] * world
    index = {k: i for i, k in enumerate(keys)}
    classes: dict[tuple[int, ...], int] = {}
    class_of = [
        classes.setdefault(col, len(classes))
        for col in zip(*(bytes_of[k] for k in keys), strict=True)
    ]
    best = [0] * len(classes)
    for state in states:
        items = [(index.get(k, -1), n) for k, n in state.items()]
        for c, values in enumerate(classes):
            total = sum(values[i] * n for i, n in items if i >= 0)
            best[c] = max(best[c], total)
    return [best[c] for c in class_of]


# ---------------------------------------------------------------------------------------
# the whole step


@attrs.frozen
class StepCost:
    """What ``cost`` found, as rows of bytes per rank (``training_cost`` makes the value
    of it), the assumptions in words, and the budget's excess as ``(message, fqn, ranks)``."""

    by_kind: dict[str, list[int]]
    traffic: dict[str, list[int]]
    largest: list[int]
    assumptions: list[str]
    over_budget: tuple[str, str, tuple[int, ...]] | None
    peak: list[int]


_TRAFFIC_SAID: Final = (
    "tp traffic: DTensor's column- and row-wise styles on a replicated input, per "
    "projection whose weight shards over 'tp': a column-wise one all-reduces its input's "
    "gradient in backward, a row-wise one its output in forward (again where full "
    "checkpointing reruns it), a sharded embedding its output; under sequence parallelism "
    "the same bytes as all-gathers and reduce-scatters, still counted per projection "
    "(torchtitan gathers a region's shared input once)",
    "ep traffic: as torchtitan's ExpertParallel and transformers' all-to-all expert "
    "parallelism train: an experts module whose parameters shard over 'ep' dispatches its "
    "routed token rows and combines them by all-to-all, in forward and backward (and again "
    "where full checkpointing reruns it), routing balanced; the token counts exchanged "
    "beside them are not counted",
)
"""What the traffic of tensor and expert parallelism assumes, as the report says it."""


@attrs.frozen
class _Acts:
    """The calls with their activations' classes, each class's bytes held and
    recomputed on a rank, the classes held through the step, a rank's total, and what
    was assumed."""

    calls: list[_Call]
    held: list[int]
    again: list[int]
    kept: list[int]
    total: int
    said: list[str]


def _aliases(fqns: Sequence[str], tied: Iterable[Iterable[str]]) -> dict[str, str]:
    """The tied aliases that are no storage of their own (all but each group's first),
    each with the group's first member."""
    groups = as_items(tied, "tied", "(frozenset({'emb.weight', 'head.weight'}),)")
    if not groups:
        return {}
    order = dict(zip(fqns, range(len(fqns)), strict=True))
    aliases: dict[str, str] = {}
    for group in groups:
        members = sorted(
            (m for m in as_items(group, "tied: a group", "{'a', 'b'}") if m in order),
            key=order.__getitem__,
        )
        aliases.update((m, members[0]) for m in members[1:])
    return aliases


def _modules_of(fqns: Iterable[str]) -> set[str]:
    """The modules holding ``fqns``: each parameter's modules, walked up to the first one
    met before (the rest were walked then)."""
    found: set[str] = set()
    for fqn in fqns:
        module = fqn.rpartition(".")[0]
        while module and module not in found:
            found.add(module)
            module = module.rpartition(".")[0]
    return found


def _floating(dtype: str) -> bool:
    """Whether FSDP2 casts a parameter of ``dtype`` to ``param_dtype`` (floating only)."""
    return dtype.startswith(("float", "bfloat"))


@attrs.frozen
class Params:
    """The parameters of a step, grouped by signature: each FQN in module order, the
    number of its signature, and each signature's (composed layout, shape) as given
    (checked where a parameter with it is first counted)."""

    fqns: Sequence[str]
    index: Sequence[int]
    signatures: Sequence[tuple[SourceLayout, object]]
    heads: Sequence[str] | None = None
    """Each parameter's first segments, at least ``depth(training)`` of them."""


def depth(training: Training) -> int:
    """How many first segments of a parameter's FQN (its head, ``heads``) the step reads:
    as many as the longest of ``training``'s unit and frozen patterns has and one more, and
    as many as its traced experts modules have. Parameters with one head are then alike in
    units and frozen-ness (the one more keeps a parameter's own name apart from its
    module's), and lie in the same experts modules."""
    units = (u.modules if not isinstance(u, str) else (u,) for u in training.units)
    patterns = [*(p for named in units for p in named), *training.frozen]
    most = max((p.count(".") + 1 for p in patterns), default=0) + 1
    routed = () if training.activations is None else training.activations.routed
    return max([most, *(name.count(".") + 1 for name in routed)])


class World:
    """What the steps on one world share (a pipeline's stages, each on the world of one
    pipeline rank): each signature measured once, each rank's index on some axes once,
    each dim's read once (``reads``: those its caller has read already, lint's)."""

    def __init__(self, reads: dict[tuple[int, Chain], DimRead] | None = None) -> None:
        self.measured: dict[_Key, Sharded] = {}
        self.indices: Indices = {}
        self.reads = {} if reads is None else reads

    def read(self, n: int, chain: Chain) -> DimRead:
        """``read_dim`` of ``n`` rows on ``chain``, worked out once."""
        found = self.reads.get((n, chain))
        if found is None:
            found = self.reads[n, chain] = read_dim(n, chain)
        return found


def cost(
    params: Params,
    sizes: Mapping[str, Mesh],
    training: Training,
    *,
    tied: Iterable[Iterable[str]],
    owned: frozenset[str],
    budget: int | None,
    in_flight: int = 1,
    microbatches: int = 1,
    world: World | None = None,
) -> StepCost:
    """One step of ``training`` over ``params`` on the world ``sizes`` lays out;
    ``budget`` bytes per rank or none. With activations: ``in_flight`` microbatches'
    held at once, ``microbatches`` run. ``world``: what the steps on these ``sizes`` and
    ``owned`` share.

    Raises:
        LayoutError: see ``training_cost``.
    """
    aliases = _aliases(params.fqns, tied)
    shared = World() if world is None else world
    step = _Step(training, sizes, owned, frozenset((*aliases, *aliases.values())), shared)
    step.in_flight, step.microbatches = in_flight, microbatches
    step.count(params, aliases)
    step.check(aliases)
    return step.result(len(params.fqns), budget)


class _Step:
    """The parameters by signature and by unit, and what they cost.

    Parameters are counted by group (``count``); each distinct (layout, shape) is
    numbered once, and a storage is then counted by a small int, ``number * 2 +
    trainable`` (``_Held``).
    """

    def __init__(
        self,
        training: Training,
        sizes: Mapping[str, Mesh],
        owned: frozenset[str],
        tied: frozenset[str],
        shared: World,
    ) -> None:
        self.training, self.sizes, self.owned, self.shared = training, sizes, owned, shared
        self.optimizer = training.kept
        self.world = world_size(sizes, "meshes")
        self.units = _Units(training)
        self.frozen = _Frozen(training.frozen)
        self.numbers: dict[_Key, int] = {}
        self.keys: list[_Key] = []
        self.sharded: list[Sharded] = []
        self.counts: dict[int, int] = {}
        self.first: dict[int, str] = {}
        self.own: dict[_Instance, dict[int, int]] = {}
        self.spans: dict[_Instance, list[int]] = {}
        self.dtypes: dict[_Instance, tuple[str, str]] = {}
        self.tied = tied
        self.owner: dict[str, _Instance] = {}  # of every tied FQN
        self.first_trainable: int | None = None
        self.instances: list[_Instance] = []
        self.in_flight = self.microbatches = 1
        self.params = Params((), (), ())
        self.groups: list[tuple[int, int, int]] = []  # signature, first and last position

    def decode(self, held: int) -> tuple[_Key, Sharded, bool]:
        """A counted storage's signature, what it is on the ranks, whether trainable."""
        number, trainable = divmod(held, 2)
        return self.keys[number], self.sharded[number], bool(trainable)

    def count(self, params: Params, aliases: Mapping[str, str]) -> None:
        """Every parameter, by group: parameters with one signature and one head
        (``heads``) are alike in units, frozen-ness and storage, so each group is worked
        out once, as at its first parameter (groups in the order of their first), and
        counted for all of its parameters."""
        self.params = params
        fqns = params.fqns
        alias = [False] * len(fqns)  # a tied alias is no storage of its own
        position: dict[str, int] = {}
        if self.tied:
            position = dict(zip(fqns, range(len(fqns)), strict=True))
            for fqn in aliases:
                alias[position[fqn]] = True
        named = heads(fqns, depth(self.training)) if params.heads is None else params.heads
        groups, of = group_index(zip(named, params.index, alias, strict=True))
        sizes = Counter(of)
        last = dict(zip(of, range(len(of)), strict=True))  # a dict keeps a key's last value
        first = first_positions(of)
        self.groups = [(number, first[g], last[g]) for g, (_, number, _) in enumerate(groups)]
        owners = [self.group(key, (first[g], last[g]), sizes[g]) for g, key in enumerate(groups)]
        for fqn in self.tied:
            self.owner[fqn] = owners[of[position[fqn]]]

    def group(self, alike: tuple[str, int, bool], span: tuple[int, int], n: int) -> _Instance:
        """``n`` parameters alike (their head, signature and whether tied aliases), from
        position ``span[0]`` to ``span[1]``: their place in their units' spans, and (unless
        tied aliases, which are no storage) their storage, measured once per signature and
        counted in their unit. The unit owning them."""
        head, number, alias = alike
        start, end = span
        holding = self.units.holding(head)
        for instance in holding:
            found = self.spans.get(instance)
            if found is None:
                self.spans[instance] = [start, end]
            else:
                found[1] = max(found[1], end)
        owner = holding[-1] if holding else _ROOT
        if alias:
            return owner
        fqn = self.params.fqns[start]
        layout, shape = self.params.signatures[number]
        check_layout(layout, fqn)
        if not isinstance(shape, ParamShape):
            msg = f"{fqn}: shapes has no ParamShape for it, got {quote(shape)}; give every shape"
            raise LayoutError(msg, fqn=fqn)
        key = (layout, shape)
        measured = self.numbers.get(key)
        if measured is None:
            measured = self.measure(fqn, key)
        trainable = not self.frozen(head)
        held = 2 * measured + trainable
        self.counts[held] = self.counts.get(held, 0) + n
        self.first.setdefault(held, fqn)
        own = self.own.setdefault(owner, {})
        if held in own:
            own[held] += n
            return owner
        own[held] = n
        if trainable:
            if self.first_trainable is None:
                self.first_trainable = start
            # FSDP2 needs one dtype over a unit's trainable parameters (_init_mp_dtypes)
            first = self.dtypes.setdefault(owner, (fqn, shape.dtype))
            if first[1] != shape.dtype:
                msg = (
                    f"{fqn}: {self.units.name(owner)} holds {first[0]} ({first[1]}) and {fqn} "
                    f"({shape.dtype}); FSDP2 needs one dtype over a unit's trainable "
                    "parameters: cast them alike or give them their own unit"
                )
                raise LayoutError(msg, fqn=fqn)
        return owner

    def measure(self, fqn: str, key: _Key) -> int:
        """A new signature, measured and numbered."""
        layout, shape = key
        mesh = self.sizes.get(layout.mesh)
        if mesh is None:
            msg = f"{fqn}: no mesh for role {layout.mesh!r} (meshes has {sorted(self.sizes)})"
            raise LayoutError(msg, fqn=fqn)
        sharded = self.shared.measured.get(key)
        if sharded is None:
            try:
                sharded = measure(layout, shape, mesh, self.owned, self.shared.read)
                self.shared.measured[key] = sharded
            except LayoutError as e:
                msg = f"{fqn}: {e.message}"
                raise LayoutError(msg, fqn=fqn, axis=e.axis, placement=e.placement) from None
        number = self.numbers[key] = len(self.keys)
        self.keys.append(key)
        self.sharded.append(sharded)
        return number

    def check(self, aliases: Mapping[str, str]) -> None:
        """Every pattern names something, and tied parameters share a unit (FSDP2 refuses
        one storage managed by two calls)."""
        self.units.check_used()
        self.frozen.check_used()
        for alias, first in aliases.items():
            a, b = self.owner.get(alias), self.owner.get(first)
            if a is not None and b is not None and a != b:
                msg = (
                    f"{alias}: tied to {first}, but {self.units.name(a)} holds it and "
                    f"{self.units.name(b)} holds {first}; FSDP2 refuses a parameter shared "
                    "by two units: put both modules in one unit (FSDPUnit([...]))"
                )
                raise LayoutError(msg, fqn=alias)

    # -- the figures -------------------------------------------------------------------

    def sum(self) -> RankSum:
        """A new sum of figures on this world's ranks."""
        return RankSum(self.sizes, self.shared.indices)

    def compute(self, shape: ParamShape) -> str:
        """The dtype FSDP2 gathers and computes ``shape``'s parameter in."""
        wanted = self.training.param_dtype
        return wanted if wanted is not None and _floating(shape.dtype) else shape.dtype

    def reduce(self, shape: ParamShape) -> str:
        """The dtype its gradient is reduced in."""
        return self.training.reduce_dtype or self.compute(shape)

    def master_bytes(self, shape: ParamShape) -> int:
        """Bytes per element of the master copy of a parameter of ``shape`` (0: none)."""
        master = self.training.master_dtype
        return 0 if master in (None, shape.dtype) else DTYPE_BYTES[master]

    def result(self, positions: int, budget: int | None) -> StepCost:
        calls, signatures, names = self.calls(positions)
        acts = self.activations(calls)
        gathers, states = _timeline(acts.calls, acts.kept)
        world = self.world
        rows: dict[_Buffer, list[int]] = {}
        # each collective's bytes summed where they live, spread over the ranks once
        sent = {name: self.sum() for name in ("all_gather", "reduce_scatter", "all_reduce")}
        largest = [0] * world
        uses = Counter(call.signature for call in calls)
        for s, (own, reshard) in enumerate(signatures):
            made = self.buffers(own, reshard)
            rows.update(((s, kind), made[kind].total()) for kind in made if kind != _HSDP)
            sent["all_gather"].merge(made[_FLAT], gathers[s])
            sent["reduce_scatter"].merge(made[_SCATTER], uses[s])
            sent["all_reduce"].merge(made[_HSDP], uses[s])
            largest = list(map(max, largest, rows[s, _FLAT]))
        traffic = {name: total.total() for name, total in sent.items()}
        buffers = {key: row for key, row in rows.items() if key[1] in _FSDP_BUFFERS}
        rows.update(((c, _ACTS), [n] * world) for c, n in enumerate(acts.held))
        rows.update(((c, _RECOMPUTE), [n] * world) for c, n in enumerate(acts.again))
        state, kept = self.state()
        by_kind = {**state, "transient": _peak(states, buffers, world)}
        peak = row_sum((kept, _peak(states, rows, world)), world)
        if self.training.activations is not None:
            by_kind["activations"] = [acts.total] * world
            traffic.update(self.parallel_traffic())
        excess = None if budget is None else self.over_budget(by_kind, peak, budget)
        said = self.assumptions(names, calls, rows, largest)
        said.extend(acts.said)
        if self.training.activations is not None:
            said.extend(_TRAFFIC_SAID)
        return StepCost(by_kind, traffic, largest, said, excess, peak)

    def parallel_traffic(self) -> dict[str, list[int]]:
        """What tensor and expert parallelism move per rank in a step, from the traced
        projections and experts modules: one rank's tokens (a ``cp``-th of the
        microbatch's), ``microbatches`` times.

        - ``"tp"``: a projection whose weight shards over ``tp`` (DTensor's column- and
          row-wise styles on a replicated input): a column-wise ``nn.Linear`` (``S(0)``)
          all-reduces its input's gradient in backward, a row-wise one (``S(1)``) its
          output in forward, and again where a checkpointed unit's backward reruns it
          (the traced output bytes count those calls); a sharded embedding all-reduces
          or gathers its output.
        - ``"ep_all_to_all"``: an experts module whose parameters shard over ``ep``
          dispatches the token rows routed to it and combines them back, in forward and
          again in backward (four exchanges of those bytes, routing balanced); six in a
          unit under full checkpointing, whose backward reruns the dispatch and the
          combine (tensors autograd saves follow both: the experts' inputs, the
          combine's indices). torchtitan's selective policy saves the exchanges' outputs.
        """
        acts = self.training.activations
        if acts is None:
            return {}
        _, cp = self.degrees()

        def sharded(layout: SourceLayout, axis: str) -> frozenset[int]:
            mesh = self.sizes.get(layout.mesh)
            split = mesh is not None and mesh.get(axis, 1) > 1
            return frozenset(
                p.dim
                for a, p in zip(layout.axes, layout.placements, strict=True)
                if split and a.name == axis and isinstance(p, (Shard, StridedShard))
            )

        params = self.params
        by_tp: OncePerKey[int, frozenset[int]] = OncePerKey(
            lambda n: sharded(params.signatures[n][0], TP_AXIS)
        )
        # each weight's projection, if traced; projections alike (traced bytes, weight's
        # signature) are counted at once
        weights = [fqn.endswith(".weight") for fqn in params.fqns]
        names = [fqn[:-7] for fqn in itertools.compress(params.fqns, weights)]
        traced = map(acts.modules.get, names)
        alike = Counter(zip(traced, itertools.compress(params.index, weights), strict=True))
        tp = 0
        for (entry, number), n in alike.items():
            if entry is None:
                continue
            kind, given, made = entry
            on = by_tp[number]
            if on:
                tp += n * -(-(made if kind == "embedding" or 0 not in on else given) // cp)
                tp += n * -(-made // cp) if kind == "linear" and {0, 1} <= on else 0
        experts: set[str] = set()
        if acts.routed:
            by_ep: OncePerKey[int, bool] = OncePerKey(
                lambda n: bool(sharded(params.signatures[n][0], EP_AXIS))
            )
            # a group's parameters lie in the same modules as deep as ``depth`` reads,
            # as deep as the experts modules: its first and last stand for all (two, for
            # a parameter named as the head itself)
            ends = (p for number, *span in self.groups if by_ep[number] for p in span)
            experts = _modules_of(params.fqns[p] for p in ends)
        # full checkpointing recomputes a unit's forward: its experts dispatch and
        # combine again (torchtitan's selective policy saves those outputs)
        rerun: tuple[str, ...] = ()
        if acts.checkpointing == "full":
            rerun = tuple(f"{m}." for unit in acts.recompute for m in unit.split(","))
        ep = sum(
            (6 if name.startswith(rerun) else 4) * -(-n // cp)
            for name, n in acts.routed.items()
            if name in experts
        )
        world, times = self.world, self.microbatches
        return {
            "tp": [tp * times] * world,
            "ep_all_to_all": [ep * times] * world,
            "pp_send_recv": [0] * world,
        }

    def degrees(self) -> tuple[int, int]:
        """The run's tensor- and context-parallel degrees (the ``tp`` and ``cp`` axes of
        its dense mesh, or its first)."""
        mesh = self.sizes.get("dense") or next(iter(self.sizes.values()))
        return mesh.get(TP_AXIS, 1), mesh.get(CP_AXIS, 1)

    def activations(self, calls: Sequence[_Call]) -> _Acts:
        """The calls with their activations' classes: each call holds what the traced
        unit naming one of its modules saved (the root ``""``), a rank's share of it,
        times the microbatches in flight; a traced unit no call matches is held through
        the step."""
        given = self.training.activations
        if given is None:
            return _Acts(list(calls), [], [], [], 0, [])
        tp, cp = self.degrees()
        sp = self.training.sequence_parallel
        shares = given.shares(tp=tp, cp=cp, sequence_parallel=sp)
        by_module = {module: name for name in given.units for module in name.split(",")}
        classes: dict[int, int] = {}
        again: dict[int, int] = {}
        out: list[_Call] = []
        met: set[str] = set()
        for call, instance in zip(calls, self.instances, strict=True):
            members = [""] if instance == _ROOT else self.units.members.get(instance, [])
            name = next((by_module[m] for m in members if m in by_module), None)
            if name is None:
                out.append(call)
                continue
            met.add(name)
            held = shares[name] * self.in_flight
            whole = sum(given.units[name].values())
            redo = -(-given.recompute.get(name, 0) * shares[name] // whole) if whole else 0
            out.append(
                attrs.evolve(
                    call,
                    acts=classes.setdefault(held, len(classes)) if held else -1,
                    recompute=again.setdefault(redo, len(again)) if redo else -1,
                )
            )
        left = [name for name in given.units if name not in met and shares[name]]
        kept = [classes.setdefault(shares[n] * self.in_flight, len(classes)) for n in left]
        total = sum(shares.values()) * self.in_flight
        said = [
            f"activations: {given.batch} x {given.seq_len} tokens a microbatch, checkpointing "
            f"{given.checkpointing!r}, {self.in_flight} microbatch"
            f"{'es' if self.in_flight != 1 else ''} held at once; a rank keeps its share under "
            f"tp={tp}, cp={cp}{', sequence parallel' if sp else ' (sequence parallelism off)'}: "
            "a unit's activations are saved during its forward and freed after its backward"
        ]
        if left:
            said.append(
                "activations: no unit of this run holds those of "
                f"{some_of([n or '(the root)' for n in left], show=quote)} (traced as units "
                "of their own): counted as held through the step"
            )
        return _Acts(
            out,
            sorted(classes, key=classes.__getitem__),
            sorted(again, key=again.__getitem__),
            kept,
            total,
            said,
        )

    def calls(
        self, positions: int
    ) -> tuple[list[_Call], list[tuple[frozenset[tuple[_Held, int]], bool | int]], dict[int, int]]:
        """The calls with parameters of their own, their distinct signatures (what they
        hold, how they reshard), and how many calls each unit makes."""
        if _ROOT in self.own:
            self.spans[_ROOT] = [0, positions - 1]
        root = self.training.root_reshard_after_forward
        numbered: dict[tuple[frozenset[tuple[_Held, int]], bool | int], int] = {}
        calls: list[_Call] = []
        per_unit: Counter[int] = Counter()
        for instance, own in self.own.items():
            written = (
                (False if root is None else root)
                if instance == _ROOT
                else self.units.reshard[instance[0]]
            )
            held = frozenset(own.items())
            reshard = self.resharding(instance, own, written)
            signature = numbered.setdefault((held, reshard), len(numbered))
            start, end = self.spans[instance]
            fires = self.first_trainable is not None and self.first_trainable <= end
            calls.append(_Call(signature, start, end, reshard, fires))
            per_unit[instance[0]] += 1
        self.instances = list(self.own)
        self.check_nested(calls)
        return calls, list(numbered), dict(per_unit)

    def check_nested(self, calls: Sequence[_Call]) -> None:
        """Raise where two calls' spans cross. A module's parameters are contiguous in
        module order, so two calls of one module each cross only where the parameters are
        out of that order; a call over several modules may interleave with another, which
        the step (that nests the calls by their spans) does not model."""
        stack: list[int] = []
        for i in sorted(range(len(calls)), key=lambda i: (calls[i].start, -calls[i].end)):
            call = calls[i]
            while stack and calls[stack[-1]].end < call.start:
                stack.pop()
            if stack and calls[stack[-1]].end < call.end:
                raise self._crossing(calls, stack[-1], i)
            stack.append(i)

    def _crossing(self, calls: Sequence[_Call], outer: int, inner: int) -> LayoutError:
        fqns = self.params.fqns
        first, last = fqns[calls[inner].start], fqns[calls[inner].end]
        one, other = self.instances[outer], self.instances[inner]
        if all(len(self.units.members.get(c, ())) < 2 for c in (one, other)):
            why = (
                "the parameters are not in module order (a module's are contiguous there), "
                "and the step runs the units in their order; list the table's entries as "
                "model.named_parameters() does (the importers do)"
            )
        else:
            why = (
                "either the parameters are not in module order (list the table's entries as "
                "model.named_parameters() does), or a unit over several modules interleaves "
                "with another, which the step does not model: give each its own unit"
            )
        msg = (
            f"{last}: {self.units.name(other)} holds {first} and {last}, but "
            f"{self.units.name(one)} holds {fqns[calls[outer].end]} between them: {why}"
        )
        return LayoutError(msg, fqn=last)

    def resharding(
        self, instance: _Instance, own: Mapping[_Held, int], written: bool | int
    ) -> bool | int:
        """How a call reshards after forward as torch reads ``written``: a group size
        must divide FSDP's shard group (its size means ``True``); torch 2.13 cannot
        reshard a DTensor parameter (one with TP/EP axes) to a smaller group."""
        if isinstance(written, bool):
            return written
        worlds = sorted({self.decode(held)[1].world for held in own})
        if len(worlds) > 1 or written > worlds[0] or worlds[0] % written:
            msg = (
                f"{self.units.name(instance)}: reshard_after_forward={written} must divide the "
                f"FSDP shard group of its parameters ({' and '.join(map(str, worlds))} "
                "ranks), as fully_shard requires; give a divisor, True or False"
            )
            raise LayoutError(msg)
        if written == worlds[0]:
            return True
        dtensor = next((self.first[h] for h in own if self.decode(h)[1].dtensor), None)
        if dtensor is not None:
            msg = (
                f"{self.units.name(instance)}: reshard_after_forward={written} reshards to a "
                f"smaller group, which torch 2.13 does not do for DTensor parameters such as "
                f"{dtensor} (it has TP/EP axes; NotImplementedError: Resharding to smaller "
                "mesh is not supported for DTensor parameters yet); give True or False"
            )
            raise LayoutError(msg, fqn=dtensor)
        return written

    def buffers(self, own: frozenset[tuple[_Held, int]], reshard: bool | int) -> dict[int, RankSum]:
        """One call's buffers per rank, by kind: its flat all-gather output, its
        unsharded parameters, the smaller group's copy, its gradients (sharded, unsharded
        and the reduce-scatter input), and ``"all_reduce"``'s HSDP buffer (kind ``-1``),
        from its parameters' padded shards.

        FSDP2 skips both collectives on a world of one rank (the unsharded parameters
        are copied from the shard); HSDP all-reduces the reduce-scatter's output over
        the replicate axis.
        """
        kinds = (_FLAT, _UNSHARDED, _POST_FORWARD, _GRAD, _UNSHARDED_GRAD, _SCATTER, _HSDP)
        sums = {kind: self.sum() for kind in kinds}
        for held, n in own:
            (_, shape), s, trainable = self.decode(held)
            gathered = n * s.world * DTYPE_BYTES[self.compute(shape)]
            sums[_UNSHARDED].add(s.role, s.padded, gathered)
            if s.world > 1:
                sums[_FLAT].add(s.role, s.padded, gathered)
            if type(reshard) is int:
                sums[_POST_FORWARD].add(s.role, s.padded, gathered // reshard)
            if trainable:
                grad = DTYPE_BYTES[self.reduce(shape)]
                sums[_GRAD].add(s.role, s.padded, n * shape.itemsize)
                sums[_UNSHARDED_GRAD].add(s.role, s.padded, gathered)
                if s.world > 1:
                    sums[_SCATTER].add(s.role, s.padded, n * s.world * grad)
                if s.replicated:
                    sums[_HSDP].add(s.role, s.padded, n * grad)
        return sums

    def state(self) -> tuple[dict[str, list[int]], list[int]]:
        """Parameters and gradients (FSDP2's padded shards), the optimizer's states and
        master copies (shaped as the local shard) per rank, and the model state they keep
        (parameters, optimizer states, master copies)."""
        params, grads, states, master = (self.sum() for _ in range(4))
        optimizer = self.optimizer
        scalars = 0
        for held, n in self.counts.items():
            (_, shape), s, trainable = self.decode(held)
            params.add(s.role, s.padded, n * shape.itemsize)
            if trainable:
                grads.add(s.role, s.padded, n * shape.itemsize)
                master.add(s.role, s.kept, n * self.master_bytes(shape))
            if trainable or optimizer.eager:
                states.add(s.role, s.kept, n * optimizer.states * shape.itemsize)
                scalars += n * optimizer.scalars * SCALAR_BYTES
        kept = self.sum()
        for total in (params, states, master):
            kept.merge(total)
        by_kind = {
            "params": params.total(),
            "grads": grads.total(),
            "optimizer": list(map(scalars.__add__, states.total())),
            "master": master.total(),
        }
        return by_kind, list(map(scalars.__add__, kept.total()))

    def assumptions(
        self,
        names: Mapping[int, int],
        calls: Sequence[_Call],
        rows: Mapping[_Buffer, Sequence[int]],
        largest: Sequence[int],
    ) -> list[str]:
        """Every default the figures rest on, in words."""
        training = self.training
        out: list[str] = []
        if not training.units:
            out.append(
                "units: none given, so the whole model is one unit (the root): FSDP2 "
                f"all-gathers all of it at once, a buffer of {human_bytes(max(largest))} per "
                "rank, held with the unsharded parameters through the step; name the repeated "
                "blocks as units (units=['model.layers.*']) to gather one at a time"
            )
        else:
            made = [
                f"{n} call{'s' if n != 1 else ''} of {quote(self.units.names[u])}"
                for u, n in sorted(names.items())
                if u >= 0
            ]
            out.append(
                f"units: the root and {', '.join(made) or 'no other call'}; each parameter "
                "belongs to the innermost unit holding it, the root holds the rest"
            )
        root = training.root_reshard_after_forward
        if root is None:
            out.append(
                "the root: FSDP2's own rule (root_reshard_after_forward=None): it does not "
                "reshard after forward, so its parameters stay unsharded from its forward to "
                "the end of backward"
            )
        elif root is True:
            out.append("the root reshards after forward and is all-gathered again in backward")
        elif root is False:
            out.append("the root keeps its parameters unsharded from forward to backward")
        else:
            out.append(f"the root reshards to groups of {root} ranks after forward")
        out.append(
            "order: units run forward in the order of their parameters (module order) and "
            "backward in reverse; in forward each unit's flat all-gather output lives until "
            "the next unit's copy-out is done, in backward the next unit is all-gathered "
            "ahead (FSDP2's implicit prefetch)"
        )
        out.append(
            "params and grads are FSDP2's padded shards: ceil(rows / FSDP ranks) rows "
            "allocated on every rank, even where to_local() holds fewer or none; optimizer "
            "states and master copies are shaped as the local shard"
        )
        name = training.optimizer if isinstance(training.optimizer, str) else "given"
        eager = (
            ", made when it is built for every parameter given to it (frozen ones too)"
            if self.optimizer.eager
            else ", for each parameter with a gradient"
        )
        out.append(
            f"optimizer {quote(name)}: {self.optimizer.states} tensor"
            f"{'s' if self.optimizer.states != 1 else ''} shaped as each parameter's local "
            f"shard and {self.optimizer.scalars} float32 scalar"
            f"{'s' if self.optimizer.scalars != 1 else ''}{eager}"
        )
        frozen = sum(n for held, n in self.counts.items() if not held % 2)
        out.append(
            f"frozen: {frozen:,} parameter{'s' if frozen != 1 else ''} (no gradient, optimizer "
            "state or reduce-scatter; still stored and all-gathered)"
            if training.frozen
            else "frozen: none, every parameter is trainable (Training(frozen=...) names "
            "those with requires_grad=False)"
        )
        gathered = training.param_dtype or "their own dtype"
        reduced = training.reduce_dtype or (
            "the compute dtype" if training.param_dtype else "their own dtype"
        )
        out.append(
            f"dtypes: parameters and gradients kept in their own dtype, all-gathered and "
            f"computed in {gathered}, gradients reduce-scattered in {reduced}"
        )
        out.append(
            "peak: the model state, plus the most that FSDP2's buffers, the activations and "
            "the gradients made so far hold at once; gradients are made in backward (a "
            "steady step after zero_grad(set_to_none=True), torch's default): a unit's "
            "unsharded gradients, then its reduce-scatter input, then its sharded gradients; "
            "FSDP2 keeps the last reduce-scatter input until the next unit's post-backward"
        )
        out.append(
            "not counted: "
            + ("" if training.activations is not None else "activations, ")
            + "mixed precision's copy-in buffer, the copies of a shard dim other than 0, the "
            "loss's own tensors, and the allocator's and communication library's own memory"
        )
        return out

    def over_budget(
        self, by_kind: Mapping[str, Sequence[int]], peak: Sequence[int], limit: int
    ) -> tuple[str, str, tuple[int, ...]] | None:
        """The ranks whose peak is above ``limit`` bytes, the worst one's bytes by kind
        and heaviest parameters (``None`` when every rank fits)."""
        found = over_limit(by_kind, peak, limit)
        if found is None:
            return None
        ranks, worst, opening = found
        heavy = []
        states = self.optimizer.states
        for held, n in self.counts.items():
            (_, shape), s, trainable = self.decode(held)
            mesh = self.sizes[s.role]
            padded = _at(mesh, worst, s.padded) * shape.itemsize * (2 if trainable else 1)
            kept = _at(mesh, worst, s.kept) * (
                states * shape.itemsize * (trainable or self.optimizer.eager)
                + self.master_bytes(shape) * trainable
            )
            heavy.append(((padded + kept) * n, self.first[held], n))
        heavy.sort(key=lambda t: (-t[0], t[1]))
        top = [
            f"{clip(fqn, 80)}{f' and {n - 1} alike' if n > 1 else ''} {human_bytes(b)}"
            for b, fqn, n in heavy[:_TOP]
        ]
        msg = (
            f"{opening}; heaviest parameters there with their grads and states: "
            f"{'; '.join(top)}; shard more (a larger FSDP or TP axis), or lighten the "
            "optimizer or the units"
        )
        return msg, heavy[0][1] if heavy else "<model>", ranks


def over_limit(
    by_kind: Mapping[str, Sequence[int]], peak: Sequence[int], limit: int
) -> tuple[tuple[int, ...], int, str] | None:
    """The ranks whose ``peak`` is above ``limit`` bytes, the worst of them, and a budget
    message's opening: the worst rank's peak and its bytes by kind (``None`` when every
    rank fits)."""
    total = peak
    ranks = tuple(r for r, b in enumerate(total) if b > limit)
    if not ranks:
        return None
    worst = max(ranks, key=total.__getitem__)
    kinds = sorted(((row[worst], k) for k, row in by_kind.items()), reverse=True)
    shown = ", ".join(f"{k} {human_bytes(b)}" for b, k in kinds if b)
    rest = [r for r in ranks if r != worst]
    others = f" (and {ranks_text(rest)})" if rest else ""
    opening = (
        f"rank {worst}{others} needs {exact_bytes(total[worst])} at its peak, above the "
        f"budget of {exact_bytes(limit)}: {shown}"
    )
    return ranks, worst, opening
