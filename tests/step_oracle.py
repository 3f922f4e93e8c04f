"""One real training step under torch's own FSDP2, measured on every gloo rank.

Each :class:`Case` names a small model, a mesh, how the model is laid out (tensor
parallelism by torch's ``parallelize_module``, experts by the package's ``distribute``),
the ``fully_shard`` calls (units, their ``reshard_after_forward``, the root's), the
``MixedPrecisionPolicy``, the frozen parameters and the optimizer. :func:`run_cases` runs
them all in one spawn of real gloo ranks (``torch_oracle.on_gloo``): on each rank every
case builds its model, wraps it, and runs forward, backward and ``optimizer.step()``
once. What each rank reports (:func:`measure_step`), all read from torch's own objects:

- ``params``: the storage FSDP2 allocates for the sharded parameters, its padded shard
  (``FSDPParam._sharded_param_data``); ``params_local``: what ``to_local()`` shows;
- ``grads``: the storage the sharded gradients live in (FSDP2 views them into its flat,
  padded reduce-scatter output); ``grads_local``: their ``to_local()`` bytes;
- ``optimizer``: ``optimizer.state`` bytes, split into ``optimizer_states`` (tensors)
  and ``optimizer_scalars`` (0-d tensors such as ``step``), and the state names;
- ``all_gather``/``reduce_scatter``/``all_reduce``: bytes through the collectives FSDP2
  calls (the gathered output, the scattered input, the reduced tensor), with the other
  side (``*_in``/``*_out``) and the number of calls; ``largest_all_gather``;
- ``buffers_peak``: the most bytes of FSDP2's own buffers alive at once over forward and
  backward: the flat all-gather outputs, the unsharded parameters and the shards an
  ``int`` ``reshard_after_forward`` keeps after forward, sampled wherever any can grow
  (``buffers_at_peak`` splits it, ``buffers_largest`` gives each one's own largest);
- ``tracker``: torch's ``FSDPMemTracker`` over a second step (its hooks change how FSDP2
  runs a grouped unit, so the measured step runs without it): its categories at its own
  peak (``at_peak``), after the step (``after``), each category's largest value
  (``largest``) and its largest ``Unsharded Param`` + ``All Gather`` (``buffers_peak``).
  That sum reads below ``buffers_peak`` above: the tracker files a unit's unsharded
  storage under its category only once FSDP2's pre-forward has returned, and by then the
  previous unit's flat output, alive through the copy-out, is gone. Each category's
  largest value equals ours.

Every case also returns, from rank 0, what the package needs to predict it: the source
table (``table_from_module`` before ``fully_shard``) and the shapes, as JSON.
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, Final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group
from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from layout_algebra import ParamLayoutTable, Shard, SourceLayout
from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.torch_bridge import distribute, shapes_from_module, table_from_module
from tests.torch_oracle import MeshFactory, on_gloo

__all__ = [
    "CASES",
    "WORLD_SIZE",
    "Case",
    "Unit",
    "measure_step",
    "run_cases",
]

WORLD_SIZE: Final = 8
"""Every case runs on the same 8 gloo ranks; meshes give FSDP 2, 4 or 8 of them."""

Reshard = bool | int | None
"""``fully_shard(reshard_after_forward=...)``: ``None`` is torch's own rule for the root."""


@attrs.frozen
class Unit:
    """One ``fully_shard`` call per module a pattern matches (``*``: one segment), or one
    call over all of ``modules`` together when ``grouped``."""

    modules: tuple[str, ...]
    reshard: Reshard = True
    grouped: bool = False


@attrs.frozen
class Case:
    """A model, its mesh and layout, its ``fully_shard`` calls and its optimizer."""

    model: str
    """``"net"`` (:class:`Net`), ``"llama"`` or ``"qwen3_moe"`` (transformers)."""
    mesh: tuple[tuple[str, int], ...]
    """The dense mesh's axes and sizes, row-major over the 8 ranks."""
    fsdp: str | tuple[str, str]
    """FSDP's axis of the dense mesh, or ``(replicate, shard)`` for HSDP."""
    units: tuple[Unit, ...] = (Unit(("layers.*",)),)
    """Innermost first, as ``fully_shard`` must be called; the root comes last."""
    root_reshard: Reshard = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    dtype: str = "float32"
    """The parameters' own dtype (their storage)."""
    optimizer: str = "adamw"
    frozen: tuple[str, ...] = ()
    """Patterns of the parameters given ``requires_grad=False`` before ``fully_shard``."""
    tp: bool = False
    """Tensor parallelism over the mesh's ``tp`` axis (``parallelize_module``)."""
    vocab: int = 16
    layers: int = 2
    hidden: int = 16
    tied: bool = False
    expert_mesh: tuple[tuple[str, int], ...] = ()
    """With experts: their mesh (``efsdp``, ``ep``), FSDP over ``efsdp``."""

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh)


CASES: Final[Mapping[str, Case]] = {
    # FSDP over all 8 ranks, everything even: the harness's own check
    "trivial": Case("net", (("dp_shard", 8),), "dp_shard", vocab=16, hidden=16),
    # two whole layers frozen, and one matrix of a third (a unit partly frozen)
    "frozen halves": Case(
        "net",
        (("dp_shard", 8),),
        "dp_shard",
        layers=4,
        frozen=("emb.weight", "layers.0.*.*", "layers.1.*.*", "layers.2.w1.*"),
    ),
    "bf16 compute, fp32 reduce": Case(
        "net",
        (("dp_replicate", 2), ("dp_shard", 4)),
        ("dp_replicate", "dp_shard"),
        param_dtype="bfloat16",
        reduce_dtype="float32",
    ),
    "bf16 params, fp32 reduce": Case(
        "net", (("dp_shard", 8),), "dp_shard", dtype="bfloat16", reduce_dtype="float32"
    ),
    "no reshard after forward": Case(
        "net", (("dp_shard", 8),), "dp_shard", layers=3, units=(Unit(("layers.*",), False),)
    ),
    "reshard after forward to 2 ranks": Case(
        "net", (("dp_shard", 8),), "dp_shard", layers=3, units=(Unit(("layers.*",), 2),)
    ),
    "reshard per unit": Case(
        "net",
        (("dp_shard", 8),),
        "dp_shard",
        layers=3,
        units=(Unit(("layers.0",), False), Unit(("layers.1",), 4), Unit(("layers.2",), True)),
    ),
    "root resharded": Case("net", (("dp_shard", 8),), "dp_shard", root_reshard=True),
    "norm and head in one unit": Case(
        "net",
        (("dp_shard", 8),),
        "dp_shard",
        units=(Unit(("layers.*",)), Unit(("norm", "head"), False, grouped=True)),
    ),
    # 50 rows over 8: 7 x 7 and 1; 12 rows over 8: 2 x 6 and two empty shards
    "uneven: vocab 50 over 8": Case("net", (("dp_shard", 8),), "dp_shard", vocab=50, hidden=12),
    "hsdp x tp": Case(
        "net",
        (("dp_replicate", 2), ("dp_shard", 2), ("tp", 2)),
        ("dp_replicate", "dp_shard"),
        tp=True,
        vocab=50,
    ),
    "tied embeddings (transformers llama)": Case(
        "llama",
        (("dp_shard", 8),),
        "dp_shard",
        units=(Unit(("model.layers.*",)),),
        vocab=50,
        tied=True,
    ),
    "transformers qwen3 moe, tp + ep + fsdp": Case(
        "qwen3_moe",
        (("dp_shard", 4), ("tp", 2)),
        "dp_shard",
        units=(Unit(("model.layers.*.mlp.experts",)), Unit(("model.layers.*",))),
        tp=True,
        vocab=50,
        expert_mesh=(("efsdp", 4), ("ep", 2)),
    ),
    **{
        f"optimizer {name}": Case("net", (("dp_shard", 8),), "dp_shard", optimizer=name)
        for name in (
            "adam",
            "adam-amsgrad",
            "sgd",
            "none",
            "adagrad",
            "rmsprop",
            "rmsprop-centered",
            "rmsprop-centered-momentum",
            "nadam",
        )
    },
}
"""Every case, by name; all run in one spawn of :data:`WORLD_SIZE` gloo ranks."""


# ---------------------------------------------------------------------------------------
# models


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.w2(torch.relu(self.w1(x)))
        return out


class Net(nn.Module):
    """An embedding, ``layers`` blocks, a norm and a head: the smallest model with units."""

    def __init__(self, case: Case) -> None:
        super().__init__()
        dim = 8
        self.emb = nn.Embedding(case.vocab, dim)
        self.layers = nn.ModuleList([Block(dim, case.hidden) for _ in range(case.layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, case.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.head(self.norm(h))
        return out


def _transformers(case: Case) -> nn.Module:
    import transformers  # noqa: PLC0415 - only the cases that use it

    common: dict[str, Any] = {
        "vocab_size": case.vocab,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": case.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": case.tied,
    }
    model: nn.Module
    if case.model == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        experts: dict[str, Any] = {
            "head_dim": 4,
            "moe_intermediate_size": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        }
        config = transformers.Qwen3MoeConfig(**common, **experts)
        model = transformers.Qwen3MoeForCausalLM(config)
    return model


def _local_experts(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """transformers' experts, computed by each rank with its own experts only.

    Expert parallelism sends each token to the rank holding its expert; what FSDP2
    allocates and moves does not depend on where tokens go, so each rank weighs every
    token by its routing weight to each local expert instead, and every local expert
    gets a gradient.
    """
    gate_up = self.gate_up_proj
    down = self.down_proj
    assert isinstance(gate_up, DTensor) and isinstance(down, DTensor)
    first = gate_up.device_mesh.get_local_rank() * gate_up.to_local().shape[0]
    out = torch.zeros_like(hidden_states)
    for e, (w13, w2) in enumerate(zip(gate_up.to_local(), down.to_local(), strict=True)):
        weight = (top_k_weights * (top_k_index == first + e)).sum(-1, keepdim=True)
        gate, up = (hidden_states @ w13.T).chunk(2, dim=-1)
        out = out + weight * ((torch.nn.functional.silu(gate) * up) @ w2.T)
    return out


def _build(case: Case, meshes: MeshFactory) -> tuple[nn.Module, ParamLayoutTable]:
    """The case's model laid out (before FSDP), and its source table."""
    torch.manual_seed(0)
    model = Net(case) if case.model == "net" else _transformers(case)
    model.to(getattr(torch, case.dtype))
    dense = meshes(case.sizes)
    roles: dict[DeviceMesh, str] = {dense: "dense"}
    if case.expert_mesh:
        expert = meshes(dict(case.expert_mesh))
        roles[expert] = "expert"
        table = ParamLayoutTable(
            {
                fqn: SourceLayout("expert", ["ep"], [Shard(0)])
                if ".experts." in fqn
                else SourceLayout("dense", (), ())
                for fqn, _ in model.named_parameters()
            }
        )
        distribute(model, table, {"dense": dense, "expert": expert})
        for name, module in model.named_modules():
            if name.endswith(".experts"):
                module.forward = types.MethodType(_local_experts, module)
    if case.tp:
        parallelize_module(model, dense["tp"], _tp_plan(case))
    for fqn, param in model.named_parameters():
        if any(_matches(pattern, fqn) for pattern in case.frozen):
            param.requires_grad_(False)
    return model, table_from_module(model, roles=roles)


def _tp_plan(case: Case) -> dict[str, ParallelStyle]:
    if case.model == "net":
        return {"layers.*.w1": ColwiseParallel(), "layers.*.w2": RowwiseParallel()}
    attention = "model.layers.*.self_attn"
    return {
        f"{attention}.q_proj": ColwiseParallel(),
        f"{attention}.k_proj": ColwiseParallel(),
        f"{attention}.v_proj": ColwiseParallel(),
        f"{attention}.o_proj": RowwiseParallel(),
    }


def _matches(pattern: str, fqn: str) -> bool:
    """``*`` matches one dotted segment, as the package's unit and frozen patterns."""
    want, got = pattern.split("."), fqn.split(".")
    return len(want) == len(got) and all(w in ("*", g) for w, g in zip(want, got, strict=True))


def _modules(model: nn.Module, pattern: str) -> list[nn.Module]:
    found = [m for name, m in model.named_modules() if name and _matches(pattern, name)]
    assert found, f"{pattern!r} names no module"
    return found


def _wrap(case: Case, model: nn.Module, meshes: MeshFactory) -> None:
    """``fully_shard`` as the case says: each unit, innermost first, then the root."""
    dense = meshes(case.sizes)
    fsdp_mesh = dense[case.fsdp]
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, case.param_dtype) if case.param_dtype else None,
        reduce_dtype=getattr(torch, case.reduce_dtype) if case.reduce_dtype else None,
    )
    for unit in case.units:
        mesh = fsdp_mesh
        if case.expert_mesh and unit.modules[0].endswith(".experts"):
            mesh = meshes(dict(case.expert_mesh))["efsdp"]
        found = [m for pattern in unit.modules for m in _modules(model, pattern)]
        calls = [found] if unit.grouped else [[m] for m in found]
        for modules in calls:
            target = modules if unit.grouped else modules[0]
            fully_shard(target, mesh=mesh, mp_policy=policy, reshard_after_forward=unit.reshard)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=policy, reshard_after_forward=case.root_reshard)


_OPTIMIZERS: Final[Mapping[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "none": lambda ps: torch.optim.SGD(ps, lr=0.01),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
    "rmsprop-centered": lambda ps: torch.optim.RMSprop(ps, lr=0.01, centered=True),
    "rmsprop-centered-momentum": lambda ps: torch.optim.RMSprop(
        ps, lr=0.01, centered=True, momentum=0.9
    ),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=0.01),
}
"""torch's optimizers by the case's name for them (the package's names, and one that
has none: centered RMSprop with momentum, three states)."""


# ---------------------------------------------------------------------------------------
# what one step allocates and moves


def _storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors by their local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _groups(model: nn.Module) -> list[Any]:
    """Every ``FSDPParamGroup`` of the model, once (a grouped call's modules share one)."""
    groups: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                groups[id(group)] = group
    return list(groups.values())


_COLLECTIVES: Final = {
    # name: (kind, the counted tensor's argument and position, the other one's)
    "all_gather_single": ("all_gather", ("output_tensor", 0), ("input_tensor", 1)),
    "reduce_scatter_single": ("reduce_scatter", ("input", 1), ("output", 0)),
    "all_reduce": ("all_reduce", ("tensor", 0), ("tensor", 0)),
}
"""The ``torch.distributed`` functions FSDP2's collectives call in this torch."""


@contextmanager
def _collectives() -> Iterator[dict[str, list[tuple[int, int]]]]:
    """Each FSDP2 collective's (counted, other side) bytes, by kind, while inside."""
    seen: dict[str, list[tuple[int, int]]] = {kind: [] for kind, _, _ in _COLLECTIVES.values()}

    def counting(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        kind, (counted, at), (other, other_at) = _COLLECTIVES[name]

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                # FSDP2's own calls only (DTensor's tensor-parallel collectives are functional)
                if _caller_module().startswith("torch.distributed.fsdp"):
                    a = kwargs[counted] if counted in kwargs else args[at]
                    b = kwargs[other] if other in kwargs else args[other_at]
                    seen[kind].append((_local_bytes(a), _local_bytes(b)))
                return fn(*args, **kwargs)

            return wrapped

        return wrap

    with contextlib.ExitStack() as stack:
        for name in _COLLECTIVES:
            stack.enter_context(_patched(dist, name, counting(name)))
        yield seen


def _caller_module() -> str:
    """The module of the function that called the wrapped collective."""
    frame = sys._getframe(2)
    name: str = frame.f_globals.get("__name__", "")
    return name


class _Buffers:
    """FSDP2's all-gather buffers alive on this rank, sampled wherever they can grow.

    The flat all-gather output is allocated by ``foreach_all_gather`` and dropped when
    its group (or the next unit's copy-out, in forward) lets go of it; each parameter's
    unsharded storage (``FSDPParam.all_gather_outputs``) is allocated for the copy-out
    and resized to nothing when freed; an ``int`` ``reshard_after_forward`` copies each
    parameter's post-forward shard out of the gathered storage before freeing it. Live
    bytes change upward only at those allocations, so sampling right after each (and
    before each free, when the copy is made) sees every peak.
    """

    def __init__(self, groups: Sequence[Any]) -> None:
        self.params: list[FSDPParam] = [p for g in groups for p in g.fsdp_params]
        self.flat: list[weakref.ref[torch.UntypedStorage]] = []
        self.peak = (0, 0, 0)
        self.largest = (0, 0, 0)

    def live(self) -> tuple[int, int, int]:
        """Bytes alive now: flat outputs, unsharded parameters, post-forward shards."""
        flat: dict[int, int] = {}
        for ref in self.flat:
            storage = ref()
            if storage is not None and storage.nbytes():
                flat[storage.data_ptr()] = storage.nbytes()
        unsharded = _storage_bytes(t for p in self.params for t in p.all_gather_outputs)
        post = _storage_bytes(
            t
            for p in self.params
            if (t := getattr(p, "_sharded_post_forward_param_data", None)) is not None
        )
        return sum(flat.values()), unsharded, post

    def sample(self) -> None:
        now = self.live()
        if sum(now) > sum(self.peak):
            self.peak = now
        self.largest = (
            max(self.largest[0], now[0]),
            max(self.largest[1], now[1]),
            max(self.largest[2], now[2]),
        )

    @contextmanager
    def watching(self) -> Iterator[None]:
        def gathered(gather: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                result = gather(*args, **kwargs)
                if result is not None:
                    self.flat.append(weakref.ref(result.all_gather_output.untyped_storage()))
                self.sample()
                return result

            return wrapped

        def initialised(init: Callable[[FSDPParam], None]) -> Callable[[FSDPParam], None]:
            def wrapped(param: FSDPParam) -> None:
                init(param)
                self.sample()

            return wrapped

        def freeing(free: Callable[[FSDPParam], None]) -> Callable[[FSDPParam], None]:
            def wrapped(param: FSDPParam) -> None:
                self.sample()
                free(param)

            return wrapped

        with (
            _patched(_fsdp_param_group, "foreach_all_gather", gathered),
            _patched(FSDPParam, "init_unsharded_param", initialised),
            _patched(FSDPParam, "free_unsharded_param", freeing),
        ):
            yield


@contextmanager
def _patched(owner: object, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``wrap(owner.name)`` while inside (torch's own code calls
    it by that name), then restored."""
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


_BUFFER_KINDS: Final = ("Unsharded Param", "All Gather")


class _Tracker(FSDPMemTracker):  # type: ignore[no-untyped-call]  # torch's mode hook is unannotated
    """torch's ``FSDPMemTracker``, also keeping each category's largest value and the
    largest ``Unsharded Param`` + ``All Gather``, after every op it sees."""

    def __init__(self, mod: nn.Module, optm: torch.optim.Optimizer) -> None:
        super().__init__(mod, optm)
        self.largest: dict[str, int] = {}
        self.buffers_peak = 0

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)
        for snap in self._curr_mem_snap.values():
            named = _named(snap)
            for kind, n in named.items():
                self.largest[kind] = max(self.largest.get(kind, 0), n)
            self.buffers_peak = max(self.buffers_peak, sum(named.get(k, 0) for k in _BUFFER_KINDS))

    def at_peak(self) -> dict[str, int]:
        snaps = list(self.get_tracker_snapshot("peak").values())
        return _named(snaps[0]) if snaps else {}


def _named(snap: Mapping[Any, int]) -> dict[str, int]:
    return {(k.value if isinstance(k, Enum) else str(k)): int(n) for k, n in snap.items()}


def _tokens(case: Case) -> torch.Tensor:
    return torch.arange(12).reshape(2, 6) % case.vocab


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    out = model(tokens)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    logits.float().square().mean().backward()
    optimizer.step()


def measure_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor
) -> dict[str, Any]:
    """One training step of ``model`` (already under ``fully_shard``), measured; then a
    second step under ``FSDPMemTracker``, whose hooks change how FSDP2 runs a grouped unit
    (it gathers it again in backward), so the first step runs without it."""
    groups = _groups(model)
    buffers = _Buffers(groups)
    with _collectives() as seen, buffers.watching():
        _step(model, optimizer, tokens)
    params = [p for g in groups for p in g.fsdp_params]
    grads = [p.sharded_param.grad for p in params if p.sharded_param.grad is not None]
    states = [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    scalars = [v for v in states if v.dim() == 0]
    gather, scatter, reduce = seen["all_gather"], seen["reduce_scatter"], seen["all_reduce"]
    parts = ("all_gather", "unsharded", "post_forward")
    measured = {
        "params": _storage_bytes(p._sharded_param_data for p in params),
        "params_padded_size": sum(
            p.padded_sharded_param_size.numel() * p._sharded_param_data.element_size()
            for p in params
        ),
        "params_local": sum(_local_bytes(p.sharded_param) for p in params),
        "grads": _storage_bytes(iter(grads)),
        "grads_local": sum(_local_bytes(g) for g in grads),
        "optimizer": sum(_local_bytes(v) for v in states),
        "optimizer_states": sum(_local_bytes(v) for v in states if v.dim() > 0),
        "optimizer_scalars": sum(_local_bytes(v) for v in scalars),
        "optimizer_state_names": sorted({k for s in optimizer.state.values() for k in s}),
        "all_gather": sum(b for b, _ in gather),
        "all_gather_in": sum(b for _, b in gather),
        "all_gather_calls": len(gather),
        "largest_all_gather": max((b for b, _ in gather), default=0),
        "reduce_scatter": sum(b for b, _ in scatter),
        "reduce_scatter_out": sum(b for _, b in scatter),
        "reduce_scatter_calls": len(scatter),
        "all_reduce": sum(b for b, _ in reduce),
        "all_reduce_calls": len(reduce),
        "buffers_peak": sum(buffers.peak),
        "buffers_at_peak": dict(zip(parts, buffers.peak, strict=True)),
        "buffers_largest": dict(zip(parts, buffers.largest, strict=True)),
    }
    tracker = _Tracker(model, optimizer)
    with tracker, warnings.catch_warnings():
        # the tracker's module tree loses its place among FSDP2's hooks on nested and
        # grouped units; the bytes it counts do not depend on that tree
        warnings.filterwarnings("ignore", "The module hierarchy tracking", UserWarning)
        _step(model, optimizer, tokens)
    measured["tracker"] = {
        "at_peak": tracker.at_peak(),
        "after": _named(next(iter(tracker.get_tracker_snapshot().values()), {})),
        "largest": tracker.largest,
        "buffers_peak": tracker.buffers_peak,
    }
    return measured


def run_case(case: Case, meshes: MeshFactory, rank: int) -> dict[str, Any]:
    """One case on this rank: build, lay out, wrap, step, measure."""
    model, table = _build(case, meshes)
    shapes = shapes_from_module(model)
    _wrap(case, model, meshes)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = _OPTIMIZERS[case.optimizer](trainable)
    result: dict[str, Any] = {"measured": measure_step(model, optimizer, _tokens(case))}
    if rank == 0:  # what the package is given: the same on every rank
        result["table"] = to_json(table)
        result["shapes"] = shapes_to_json(shapes)
    return result


def scenario(rank: int, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    meshes = MeshFactory(WORLD_SIZE)
    return {name: run_case(CASES[name], meshes, rank) for name in names}


def run_cases(names: Sequence[str] = tuple(CASES)) -> list[dict[str, dict[str, Any]]]:
    """Every named case on :data:`WORLD_SIZE` gloo ranks, in one spawn: per rank, per case,
    ``{"measured": ...}`` (and on rank 0 ``"table"`` and ``"shapes"``)."""
    return on_gloo(scenario, list(names), world_size=WORLD_SIZE)
