"""The activations a live model saves for one microbatch, traced without real memory.

``activations_from_module`` runs the model's forward once on fake tensors (torch's
``FakeTensorMode``: CPU tensors as far as every kernel choice goes, backed by meta storage,
so nothing is allocated) under ``torch.autograd.graph.saved_tensors_hooks``, and counts
the bytes of each distinct storage autograd saves, as ``Activations`` holds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from layout_algebra._patterns import WILDCARD, Matcher, Rule
from layout_algebra._text import quote
from layout_algebra.activations import CHECKPOINTING, KINDS, MAX_TOKENS, Activations
from layout_algebra.errors import LayoutError
from layout_algebra.torch_bridge._checks import check_module
from layout_algebra.torch_bridge._walk import named_modules
from layout_algebra.torch_bridge.training import training_from_module
from layout_algebra.training import FSDPUnit

__all__ = ["activations_from_module"]

_CALLER: Final = "activations_from_module"

_EXPERTS: Final = frozenset({"experts", "routed_experts"})
"""Module names under which tokens are the ones routed to experts (a shared expert, run
on every token, is a dense MLP)."""

_MATMULS: Final = frozenset({"mm.default", "linear.default"})
"""The ops torchtitan's selective policy counts as matmuls (every second one recomputed)."""

_SAVED_OPS: Final = frozenset(
    {
        # the partitioner's compute-intensive ops (``get_default_op_list``)
        "mm.default",
        "addmm.default",
        "bmm.default",
        "convolution.default",
        "convolution_backward.default",
        "_scaled_mm.default",
        "upsample_bilinear2d.default",
        "_scaled_dot_product_flash_attention.default",
        "_scaled_dot_product_efficient_attention.default",
        "_flash_attention_forward.default",
        "_efficient_attention_forward.default",
        # torchtitan's own additions
        "_scaled_dot_product_cudnn_attention.default",
        "_scaled_dot_product_attention_math.default",
        "_scaled_dot_product_fused_attention_overrideable.default",
        "max.default",
        "linear.default",
        "topk.default",
        "reduce_scatter_tensor.default",
        "all_to_all_single.default",
        # the CPU's flash attention, which the trace runs where a GPU runs the one above
        "_scaled_dot_product_flash_attention_for_cpu.default",
    }
)
"""The ops whose outputs torchtitan's selective policy saves, by ``name.overload``."""

_ROUTER: Final = "moe.router.gate"
"""Modules whose matmul shape torchtitan's selective policy always recomputes."""


@attrs.frozen
class _Call:
    """One ``fully_shard`` call: its name, and whether a policy checkpoints it."""

    name: str
    checkpointed: bool
    forced: frozenset[tuple[int, int]] = frozenset()
    """Matmul right-hand shapes the selective policy recomputes (the router's)."""
    block: bool = False
    """Whether it is a repeated block (a unit given as a pattern, ``layers.*``)."""


@attrs.frozen
class _Event:
    """One storage kept: by whom, of what kind, and how (``saved`` by autograd, the
    ``input`` of a call, or the output of an op the selective policy ``kept``)."""

    key: int
    nbytes: int
    call: str
    kind: str
    how: str


def _check_count(value: object, arg: str) -> int:
    if type(value) is not int or not 1 <= value <= MAX_TOKENS:
        msg = f"{_CALLER}({arg}=...) must be an int from 1 to {MAX_TOKENS:,}, got {quote(value)}"
        raise LayoutError(msg)
    return value


def activations_from_module(
    model: nn.Module, *, batch: int, seq_len: int, checkpointing: str = "none"
) -> Activations:
    """The bytes autograd saves for one microbatch of ``batch`` sequences of ``seq_len``
    token ids, per unit, as ``training_from_module`` infers the units.

    The forward runs once on fake tensors (no memory, CPU kernels chosen: attention as
    torch's CPU flash kernel saves it); a storage saved twice, or by two units, counts
    once, at the first; parameters, buffers and views of them are not activations. A
    torchtitan decoder is given its own attention masks (``get_attention_masks``). The
    loss is outside the model's forward and not traced. The model runs in its own dtype:
    give it the dtype FSDP2 computes in (``param_dtype``), or a parameter the forward
    casts (torchtitan's experts cast theirs to bfloat16) is saved as a copy.

    ``checkpointing`` applies to the repeated blocks (the units given as patterns,
    ``layers.*``), as torchtitan and transformers apply it; other units keep what they save:

    - ``"none"``: everything autograd saves.
    - ``"full"``: a block keeps its positional tensor inputs (what
      ``torch.utils.checkpoint`` saves); ``recompute`` is what its backward saves again.
    - ``"selective"``: torchtitan's per-op policy (``SelectiveAC``), approximated: a
      block keeps its inputs and the outputs of the ops the policy saves (matmuls but
      every second one, the router's always recomputed; attention; ``max``, ``topk``;
      the collectives), read at the dispatcher as the policy reads them. The
      approximation: the kernels are those chosen on the CPU (its flash attention stands
      for the GPU's, which the policy saves), flex attention and compiled regions are
      not seen, and the policy's rule for device-to-host copies does not arise.
      ``recompute`` is what the block's backward saves again beyond what it keeps.

    Args:
        model: the model (meta device welcome); it is not changed.
        batch: the microbatch's sequences.
        seq_len: the tokens of each.
        checkpointing: ``"none"``, ``"full"`` or ``"selective"``.

    Returns:
        The saved bytes per unit, by kind (see ``Activations``).

    Raises:
        BindError: ``model`` is not an ``nn.Module``.
        LayoutError: a bad argument, or the forward failed on fake tensors (naming why).
    """
    check_module(model, f"{_CALLER}(model=...)")
    batch = _check_count(batch, "batch")
    seq_len = _check_count(seq_len, "seq_len")
    if checkpointing not in CHECKPOINTING:
        names = ", ".join(repr(p) for p in CHECKPOINTING)
        msg = f"{_CALLER}(checkpointing=...) must be one of {names}, got {quote(checkpointing)}"
        raise LayoutError(msg)
    calls = calls_of(model, checkpointing)
    selective = checkpointing == "selective"
    traced = trace(model, calls, batch=batch, seq_len=seq_len, selective=selective)
    return compose(traced, calls, batch=batch, seq_len=seq_len, checkpointing=checkpointing)


def calls_of(model: nn.Module, checkpointing: str) -> dict[str, _Call]:
    """Each module FQN that starts a ``fully_shard`` call, and that call: its name (the
    FQNs of its modules, comma-joined) and whether ``checkpointing`` applies to it (the
    units given as patterns, the repeated blocks). The root, ``""``, is not listed."""
    units = training_from_module(model).units
    rules: list[Rule[int]] = []
    for u, unit in enumerate(units):
        patterns = unit.modules if isinstance(unit, FSDPUnit) else (unit,)
        rules.extend(Rule(p, u) for p in patterns)
    matcher = Matcher(rules)
    members: dict[tuple[int, tuple[str, ...]], list[tuple[str, nn.Module]]] = {}
    for fqn, module in named_modules(model):
        if not fqn:
            continue
        found = matcher.every(fqn)
        if found:
            rule = matcher.rule(found[0])
            wild = zip(fqn.split("."), rule.segments, strict=True)
            binding = tuple(s for s, p in wild if p == WILDCARD)
            members.setdefault((rule.value, binding), []).append((fqn, module))
    out: dict[str, _Call] = {}
    for (u, _), modules in members.items():
        unit = units[u]
        block = isinstance(unit, str) and WILDCARD in unit.split(".")
        name = ",".join(fqn for fqn, _ in modules)
        forced = frozenset(
            (m.in_features, m.out_features)
            for fqn, module in modules
            for sub, m in named_modules(module, fqn)
            if _ROUTER in sub and isinstance(m, nn.Linear)
        )
        call = _Call(name, block and checkpointing != "none", forced, block)
        for fqn, _ in modules:
            out[fqn] = call
    return out


@attrs.define
class _Tracer:
    """What one traced forward keeps, as it runs."""

    calls: Mapping[str, _Call]
    hidden: int | None
    tokens: frozenset[int]
    params: set[int]
    events: list[_Event] = attrs.field(factory=list)
    stack: list[tuple[str, nn.Module]] = attrs.field(factory=list)
    keep: list[object] = attrs.field(factory=list)  # storages alive: no key reused
    matmuls: dict[str, int] = attrs.field(factory=dict)
    linears: dict[nn.Module, int] = attrs.field(factory=dict)  # modules hash by identity
    fed: dict[str, int] = attrs.field(factory=dict)
    """Per region (a module over two projections or more, by FQN), the storage its first
    projection read in the region's current forward."""
    wise: dict[str, str] = attrs.field(factory=dict)
    """Per ``nn.Linear`` (by FQN), the kind of its input in its current forward."""
    given: dict[str, set[int]] = attrs.field(factory=dict)
    """Per region, the storages of the tensors its current forward was given."""
    boundary: int = 0
    """The bytes of the first repeated block's output."""
    modules: dict[str, tuple[str, int, int]] = attrs.field(factory=dict)
    """Per ``nn.Linear``/``nn.Embedding``, its kind and input and output bytes so far."""
    routed: dict[str, int] = attrs.field(factory=dict)
    """Per experts module, the bytes of the token rows routed into it so far."""
    packs: int = 0
    """The tensors autograd has saved so far (parameters too)."""
    last: dict[str, int] = attrs.field(factory=dict)
    """Per checkpointed call, the number of the last tensor autograd saved in it."""
    ran: list[tuple[str, str, int, int]] = attrs.field(factory=list)
    """Each projection run in a checkpointed call: the call, its FQN, its output's
    bytes and ``packs`` when it returned."""

    def call(self) -> _Call | None:
        """The innermost running call (``None``: the root)."""
        for fqn, _ in reversed(self.stack):
            found = self.calls.get(fqn)
            if found is not None:
                return found
        return None

    def kind(self, shape: Sequence[int], key: int) -> str:
        """How a tensor of ``shape`` on the storage ``key``, saved where the forward is
        now, divides."""
        if any(set(fqn.split(".")) & _EXPERTS for fqn, _ in self.stack):
            return "experts"  # routed: top-k rows a token, no token dim to find
        if not self.tokens.intersection(shape):
            return "fixed"
        for fqn, module in reversed(self.stack):
            if fqn in self.calls:
                break
            if isinstance(module, nn.Linear):
                return self.wise.get(fqn, "sequence")
            own = list(module.parameters(recurse=False))
            if own:  # a norm, an embedding, a router: over the hidden size or per head
                return "sequence" if own[0].shape[-1] == self.hidden else "heads"
            if self.projections(module) >= 2:  # between attention's or an MLP's projections
                # what the region was given (rotary tables) is whole on every TP rank
                return "sequence" if key in self.given.get(fqn, ()) else "heads"
        return "sequence"

    def projections(self, module: nn.Module) -> int:
        """How many ``nn.Linear`` sit at or below ``module`` (worked out once each)."""
        found = self.linears.get(module)
        if found is None:
            found = self.linears[module] = sum(isinstance(m, nn.Linear) for m in module.modules())
        return found

    def add(self, tensor: torch.Tensor, how: str) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.params:
            return
        self.keep.append(storage)
        call = self.call()
        name = "" if call is None else call.name
        self.events.append(_Event(key, storage.nbytes(), name, self.kind(tensor.shape, key), how))

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        call = self.call()
        if call is not None and call.checkpointed:
            self.last[call.name] = self.packs
        self.packs += 1
        self.add(tensor, "saved")
        return tensor

    def projection(self, fqn: str, module: nn.Module, args: tuple[Any, ...]) -> None:
        """Whether the ``nn.Linear`` at ``fqn``, about to run on ``args``, is column-wise
        (it reads what its region's first projection read: the region's input, held
        whole on every TP rank) or row-wise (it reads what the region made: sharded).
        q, k and v (or a fused qkv), gate and up read the input; o and down do not."""
        if not args or not isinstance(args[0], torch.Tensor):
            return
        key = args[0].untyped_storage()._cdata
        region = next(
            (f for f, m in reversed(self.stack) if m is not module and self.projections(m) >= 2),
            None,
        )
        if region is None or region in self.calls:
            self.wise[fqn] = "sequence"
            return
        first = self.fed.setdefault(region, key)
        self.wise[fqn] = "sequence" if key == first else "heads"

    def pre(self, fqn: str) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.fed.pop(fqn, None)  # a region's new forward
            if isinstance(module, nn.Linear):
                self.projection(fqn, module, args)
            elif self.projections(module) >= 2:
                self.given[fqn] = {
                    t.untyped_storage()._cdata
                    for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)
                }
            self.stack.append((fqn, module))
            call = self.calls.get(fqn)
            if call is not None and call.checkpointed:
                self.matmuls[call.name] = 0
                for arg in args:
                    if isinstance(arg, torch.Tensor):
                        self.add(arg, "input")

        return hook

    def flows(self, fqn: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """What the run's other parallelisms move around ``module``'s call: a projection's
        input and output, the token rows an experts module is given (its input's rows, times
        the top-k indices given beside them), a repeated block's output."""
        given = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
        made = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
        kind = (
            "linear"
            if isinstance(module, nn.Linear)
            else "embedding"
            if isinstance(module, nn.Embedding)
            else None
        )
        if kind is not None and given and made:
            _, a, b = self.modules.get(fqn, (kind, 0, 0))
            self.modules[fqn] = (kind, a + _nbytes(given[0]), b + _nbytes(made[0]))
            call = self.call()
            if call is not None and call.checkpointed:
                self.ran.append((call.name, fqn, _nbytes(made[0]), self.packs))
        elif fqn.rpartition(".")[2] in _EXPERTS and given:
            rows = given[0]
            # the top-k indices: integers shaped as the rows but their last dim, (tokens,
            # k) beside transformers' (tokens, dim), (batch, seq, k) beside torchtitan's
            # (batch, seq, dim)
            k = next(
                (
                    t.shape[-1]
                    for t in given[1:]
                    if not t.is_floating_point()
                    and t.dim() == rows.dim()
                    and t.shape[:-1] == rows.shape[:-1]
                ),
                1,
            )
            self.routed[fqn] = self.routed.get(fqn, 0) + _nbytes(rows) * k
        call = self.calls.get(fqn)
        if call is not None and call.block and not self.boundary and made:
            self.boundary = _nbytes(made[0])

    def post(self, fqn: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self.flows(fqn, module, args, output)
            while self.stack and self.stack[-1][0] != fqn:
                self.stack.pop()
            if self.stack:
                self.stack.pop()

        return hook

    def op(self, func: Any, args: Sequence[Any], outputs: Any) -> None:
        """torchtitan's selective policy, for an op run inside a checkpointed call."""
        call = self.call()
        if call is None or not call.checkpointed:
            return
        name = str(getattr(func, "__name__", ""))
        if name in _MATMULS:
            rhs = tuple(args[1].shape) if len(args) > 1 else ()
            if name == "linear.default":  # its weight is (out, in), an mm's right (in, out)
                rhs = rhs[::-1]
            if rhs in call.forced:
                return
            self.matmuls[call.name] = count = self.matmuls.get(call.name, 0) + 1
            if count % 2 == 0:
                return
        if name in _SAVED_OPS:
            for out in tree_leaves(outputs):
                if isinstance(out, torch.Tensor):
                    self.add(out, "kept")


class _Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    """Hands every op that runs to the tracer's selective policy."""

    def __init__(self, tracer: _Tracer) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.tracer = tracer

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.tracer.op(func, args, out)
        return out


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _hidden(model: nn.Module) -> int | None:
    """The model's hidden size: its first embedding's width."""
    return next(
        (m.embedding_dim for _, m in named_modules(model) if isinstance(m, nn.Embedding)), None
    )


def trace(
    model: nn.Module,
    calls: Mapping[str, _Call],
    *,
    batch: int,
    seq_len: int,
    selective: bool = False,
    fake: bool = True,
) -> _Tracer:
    """One forward traced: the storages it keeps, in the order it keeps them
    (``.events``), and what moves around its projections, experts and blocks;
    ``fake=False`` runs it on the model's own tensors (a model on the CPU), as the
    tests' oracle does."""
    mode: contextlib.AbstractContextManager[object]
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    fakes: dict[torch.Tensor, torch.Tensor] = {}  # a tensor hashes by identity: held here
    state: dict[str, torch.Tensor] = {}
    tensors = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    with mode:
        for name, tensor in tensors:
            if not fake:
                fakes[tensor] = state[name] = tensor
                continue
            made = fakes.get(tensor)
            if made is None:  # one fake per tensor object: tied ones stay tied
                made = torch.empty_strided(
                    tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu"
                ).requires_grad_(tensor.requires_grad)
                fakes[tensor] = made
            state[name] = made
        ids = torch.zeros((batch, seq_len), dtype=torch.long, device="cpu")
    tracer = _Tracer(
        calls,
        _hidden(model),
        frozenset({seq_len, batch * seq_len}),
        {t.untyped_storage()._cdata for t in fakes.values()},
    )
    tracer.keep.extend(fakes.values())
    handles = []
    for fqn, module in named_modules(model):
        handles.append(module.register_forward_pre_hook(tracer.pre(fqn), with_kwargs=True))
        handles.append(module.register_forward_hook(tracer.post(fqn), always_call=True))
    try:
        kwargs = _masks(model, batch, seq_len)  # data, made for real: see _masks
        with contextlib.ExitStack() as stack:
            stack.enter_context(mode)
            if selective:
                stack.enter_context(_Ops(tracer))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(tracer.pack, _same))
            functional_call(model, state, (ids,), kwargs, tie_weights=False, strict=False)
    except LayoutError:
        raise
    except Exception as e:
        msg = (
            f"{_CALLER}: the model's forward failed on fake tensors of {batch} x {seq_len} "
            f"token ids: {quote(e)}; check that its forward takes token ids alone"
        )
        raise LayoutError(msg) from e
    finally:
        for handle in handles:
            handle.remove()
    return tracer


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _masks(model: nn.Module, batch: int, seq_len: int) -> dict[str, Any]:
    """A torchtitan decoder's attention masks, made by its own ``get_attention_masks``
    (it needs them; transformers' models make their own)."""
    get = getattr(type(model), "get_attention_masks", None)
    if not callable(get):
        return {}
    positions = torch.arange(seq_len, device="cpu").expand(batch, seq_len)
    try:
        masks = get(model, positions)
    except TypeError:  # torchtitan's answer for an attention that takes none (SDPA)
        return {}
    return {"positions": positions, "attention_masks": masks}


def compose(
    traced: _Tracer,
    calls: Mapping[str, _Call],
    *,
    batch: int,
    seq_len: int,
    checkpointing: str,
) -> Activations:
    """``Activations`` from a trace: what each call holds under the policy, every storage
    counted once at its first holder, what a checkpointed call recomputes, and what
    moves around projections, experts and blocks."""
    events = traced.events
    checkpointed = {c.name for c in calls.values() if c.checkpointed}
    order = ["", *dict.fromkeys(c.name for c in calls.values())]
    units: dict[str, dict[str, int]] = {name: dict.fromkeys(KINDS, 0) for name in order}
    held: set[int] = set()
    for e in events:
        keeps = (e.how != "saved") if e.call in checkpointed else (e.how == "saved")
        if keeps and e.key not in held:
            held.add(e.key)
            units[e.call][e.kind] += e.nbytes
    recompute: dict[str, int] = dict.fromkeys(sorted(checkpointed, key=order.index), 0)
    for e in events:
        if e.call in checkpointed and e.how == "saved" and e.key not in held:
            held.add(e.key)  # counted once: a storage saved twice is one
            recompute[e.call] += e.nbytes
    # A checkpointed call's backward runs its forward again only until autograd has
    # saved its last tensor (torch.utils.checkpoint stops early there): a projection
    # that returned before that runs twice, and tensor parallelism moves its output
    # again (a row-wise projection's forward all-reduce).
    modules = dict(traced.modules)
    for name, fqn, made, at in traced.ran:
        if traced.last.get(name, -1) >= at:
            kind, given, out = modules[fqn]
            modules[fqn] = (kind, given, out + made)
    return Activations(
        units=units,
        batch=batch,
        seq_len=seq_len,
        checkpointing=checkpointing,
        recompute=recompute,
        boundary=traced.boundary,
        modules=modules,
        routed=traced.routed,
    )
