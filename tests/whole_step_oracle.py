"""A whole training step on 4 real gloo ranks: activations, peak, and what TP, EP and PP move.

:func:`run_all` runs everything in one spawn of :data:`WORLD_SIZE` gloo ranks
(``torch_oracle.on_gloo``); each rank reports what torch did there, read from torch's own
objects and hooks, never computed:

- **dense runs** (:data:`RUNS`): transformers' Llama (float32) and Qwen3-MoE (bfloat16),
  two layers, tensor parallelism by torch's ``parallelize_module`` (attention, and the
  Llama's MLP, Megatron-style) on ``dp_shard=2 x tp=2``, optionally
  ``checkpoint_wrapper`` on each decoder layer (as transformers and torchtitan apply full
  activation checkpointing), then ``fully_shard`` per decoder layer and at the root, and
  AdamW. The first step (:func:`_first_step`) counts what autograd saves in the model's
  forward under ``saved_tensors_hooks`` (each storage once, a DTensor by its local
  tensor, the parameters and buffers the forward runs with left out), per unit module,
  and the bytes handed to the functional collectives DTensor issues through forward and
  backward (:class:`Collectives`). After ``optimizer.step()`` and
  ``zero_grad(set_to_none=True)``, a second, steady step runs under torch's
  ``FSDPMemTracker``, whose peak snapshot is reported by category.
- **pipeline runs** (:data:`PIPELINES`): :class:`PipeNet` split by hand into the two stages
  ``Stages.balanced`` gives, on ``pp=2 x dp_shard=2``, each stage's layers and root under
  ``fully_shard``, a ``PipelineStage`` run by ``ScheduleGPipe`` or ``Schedule1F1B`` with 2
  or 4 microbatches, two steps. On the second (the first also infers shapes, running the
  stage once more): the bytes of every tensor handed to a send op (``dist.isend``, as
  the schedule fires them through its ``_batch_p2p``) and the most bytes autograd holds
  at once for the stage's forwards (:class:`HeldSaved`); and the storage of the stage's
  parameters (FSDP2's padded shards).
- **expert parallelism** (when torchtitan is installed): torchtitan's Qwen3-MoE debug
  model (two layers, four experts, its router's round-robin routing for balanced load)
  under its own ``parallelize_qwen3`` with ``ep=2`` (``efsdp=2``, dense FSDP over 4), with
  its full activation checkpointing and without, one forward and backward each: the
  bytes of token rows handed to ``all_to_all_single``.

From rank 0 each dense run also returns what the package needs to predict it: the source
table (``table_from_module`` after tensor parallelism, before FSDP) and the shapes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import Enum
from typing import Any, Final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, schedules
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode

from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.torch_bridge import shapes_from_module, table_from_module
from tests.models import hf_llama, hf_moe, on_cpu
from tests.test_stages_gloo import STAGES, VOCAB
from tests.test_stages_gloo import Net as PipeNet
from tests.torch_oracle import MeshFactory, on_gloo

__all__ = [
    "BATCH",
    "DENSE",
    "EXPERT_MESHES",
    "MICROBATCH",
    "PIPE",
    "PIPELINES",
    "RUNS",
    "SEQ",
    "STAGES",
    "UNIT_MODULES",
    "WORLD_SIZE",
    "PipeNet",
    "Run",
    "dense_model",
    "has_torchtitan",
    "run_all",
    "titan_moe",
]

WORLD_SIZE: Final = 4
BATCH, SEQ = 2, 16
"""The dense runs' batch: 2 sequences of 16 tokens."""
DENSE: Final = {"dp_shard": 2, "tp": 2}
PIPE: Final = {"pp": 2, "dp_shard": 2}
EXPERT_MESHES: Final = {"dense": {"dp_shard": 4}, "expert": {"efsdp": 2, "ep": 2}}
"""torchtitan's meshes for ``ep=2`` on 4 ranks: FSDP over all 4, the experts over
``efsdp=2`` inside each ``ep`` shard."""


@attrs.frozen
class Run:
    """A transformers model under TP and FSDP2, with or without full checkpointing."""

    model: str
    """``"llama"`` (float32) or ``"qwen3_moe"`` (bfloat16)."""
    checkpointing: str
    """``"none"`` or ``"full"`` (``checkpoint_wrapper`` on each decoder layer)."""


RUNS: Final = {
    f"{model} {policy}": Run(model, policy)
    for model in ("llama", "qwen3_moe")
    for policy in ("none", "full")
}

UNIT_MODULES: Final = (
    "model.embed_tokens",
    *(f"model.layers.{i}" for i in range(2)),
    "model.norm",
    "lm_head",
)
"""The modules saved bytes are filed under (the innermost running; ``""`` otherwise):
every module of the units ``training_from_module`` infers for these models."""

_ATTENTION: Final[dict[str, ParallelStyle]] = {
    **{f"model.layers.*.self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
    "model.layers.*.self_attn.o_proj": RowwiseParallel(),
}
_PLANS: Final[dict[str, dict[str, ParallelStyle]]] = {
    "llama": {
        **_ATTENTION,
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
    },
    # attention over tp, the experts whole on every tp rank
    "qwen3_moe": dict(_ATTENTION),
}


def dense_model(model: str) -> nn.Module:
    """The run's model on the meta device: two KV heads (one query and one KV head per TP
    rank); the MoE in bfloat16, the dtype it computes in."""
    if model == "llama":
        built: nn.Module = hf_llama(num_key_value_heads=2)
        return built
    moe: nn.Module = hf_moe(num_key_value_heads=2)
    return moe.to(torch.bfloat16)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _key(t: torch.Tensor) -> int:
    key: int = _local(t).untyped_storage()._cdata
    return key


def _running(model: nn.Module) -> set[int]:
    """The storages of the parameters and buffers ``model`` runs with now (FSDP2 swaps
    its unsharded parameters in for a unit's forward)."""
    return {_key(t) for t in (*model.parameters(), *model.buffers())}


# ---------------------------------------------------------------------------------------
# what autograd saves, and what DTensor's collectives move


@contextlib.contextmanager
def saved_bytes(model: nn.Module, modules: Iterable[str]) -> Iterator[dict[str, int]]:
    """While inside, the bytes of the distinct storages autograd saves, filed under the
    innermost of ``modules`` running (``""`` for none); parameters and buffers left out."""
    names = set(modules)
    stack = [""]
    saved: dict[int, tuple[str, int]] = {}
    keep: list[object] = []  # storages alive until counted: no key reused
    out: dict[str, int] = {}

    def enter(name: str) -> Callable[[nn.Module, object], None]:
        return lambda module, args: stack.append(name)

    def leave(module: nn.Module, args: object, output: object) -> None:
        stack.pop()  # returning None keeps the module's output

    handles = []
    for fqn, module in model.named_modules():
        if fqn in names:
            handles.append(module.register_forward_pre_hook(enter(fqn)))
            handles.append(module.register_forward_hook(leave, always_call=True))

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = _local(tensor).untyped_storage()
        key = storage._cdata
        if key not in saved and key not in _running(model):
            saved[key] = (stack[-1], storage.nbytes())
            keep.append(storage)
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield out
    finally:
        for handle in handles:
            handle.remove()
    for unit, nbytes in saved.values():
        out[unit] = out.get(unit, 0) + nbytes


_COLLECTIVES: Final = frozenset(
    {"all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"}
)
"""The functional collectives (``torch.ops._c10d_functional``) that move tensor data."""


class Collectives(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    """The bytes of the floating-point tensors handed to each functional collective while
    active, by op name: DTensor's redistributions (tensor parallelism) and torchtitan's
    expert exchanges issue these; FSDP2's own collectives are not functional. An integer
    tensor (torchtitan's exchange of token counts) is no activation and is left out."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        namespace = getattr(func, "namespace", "")
        name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
        if namespace == "_c10d_functional" and name in _COLLECTIVES:
            t = args[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.bytes[name] = self.bytes.get(name, 0) + t.numel() * t.element_size()
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------------
# the dense runs


def _named(snap: Mapping[Any, int]) -> dict[str, int]:
    return {(k.value if isinstance(k, Enum) else str(k)): int(n) for k, n in snap.items()}


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, as a language model trains (the targets unshifted: the
    bytes do not depend on them)."""
    flat = logits.reshape(-1, logits.shape[-1])
    loss: torch.Tensor = nn.functional.cross_entropy(flat, tokens.reshape(-1))
    return loss


def _first_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor
) -> dict[str, Any]:
    """One step: the saved bytes of the model's forward (the loss's own are outside it),
    and the collectives' bytes through forward and backward."""
    collectives = Collectives()
    with collectives:
        with saved_bytes(model, UNIT_MODULES) as saved:
            logits = model(tokens).logits
        _loss(logits, tokens).backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"saved": saved, "collectives": collectives.bytes}


def _tracked_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor
) -> dict[str, int]:
    """A steady step (gradients dropped by the last ``zero_grad``) under torch's
    ``FSDPMemTracker``: its categories at its peak."""
    tracker = FSDPMemTracker(model, optimizer)
    with tracker, warnings.catch_warnings():
        # the tracker's module tree loses its place among FSDP2's hooks around the
        # checkpoint wrappers; the bytes it counts do not depend on that tree
        warnings.filterwarnings("ignore", "The module hierarchy tracking", UserWarning)
        _loss(model(tokens).logits, tokens).backward()  # type: ignore[no-untyped-call]  # as above
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    snaps = list(tracker.get_tracker_snapshot("peak").values())
    return _named(snaps[0]) if snaps else {}


def _dense(run: Run, meshes: MeshFactory, rank: int) -> dict[str, Any]:
    torch.manual_seed(0)
    mesh = meshes(DENSE)
    model = on_cpu(dense_model(run.model))
    parallelize_module(model, mesh["tp"], _PLANS[run.model])
    table = table_from_module(model, roles={mesh: "dense"})
    shapes = shapes_from_module(model)
    layers = model.get_submodule("model.layers")
    assert isinstance(layers, nn.ModuleList)
    for i, layer in enumerate(layers):
        if run.checkpointing == "full":
            layer = layers[i] = checkpoint_wrapper(layer)  # noqa: PLW2901 - the layer, wrapped
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    head = model.get_submodule("lm_head")
    assert isinstance(head, nn.Linear)
    tokens = torch.arange(BATCH * SEQ).reshape(BATCH, SEQ) % head.out_features
    result = _first_step(model, optimizer, tokens)
    result["tracker"] = _tracked_step(model, optimizer, tokens)
    if rank == 0:  # what the package is given: the same on every rank
        result["table"] = to_json(table)
        result["shapes"] = shapes_to_json(shapes)
    return result


# ---------------------------------------------------------------------------------------
# the pipeline runs

MICROBATCH, PIPE_SEQ = 2, 5
"""Each microbatch: 2 sequences of 5 tokens."""
PIPELINES: Final = {
    f"{schedule} x{m}": (schedule, m) for schedule in ("gpipe", "1f1b") for m in (2, 4)
}
_SCHEDULES: Final = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def _stage(net: PipeNet, stage: int) -> PipeNet:
    """``net`` cut to the modules ``STAGES`` gives ``stage`` (torchtitan's split)."""
    keep = set(STAGES.stages[stage])
    for i in list(net.layers):
        if f"layers.{i}" not in keep:
            del net.layers[i]
    for name in ("tok_embeddings", "norm", "lm_head"):
        if name not in keep:
            setattr(net, name, None)
    return net


class _Holder:
    """What a saved-tensor hook hands autograd: autograd keeps it as long as it keeps the
    saved tensor, and drops it when it frees it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class HeldSaved:
    """The bytes autograd holds for ``module``'s forwards, each storage once while any
    saved tensor on it is held (parameters left out), and the most held at once.

    Counted by what autograd keeps, not by storage lifetime: a pipeline stage keeps its
    receive buffers (a microbatch's input) for later steps, after autograd has let go."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.holders: dict[int, int] = {}
        self.nbytes: dict[int, int] = {}
        self.live = self.peak = 0
        self.hooks: list[contextlib.AbstractContextManager[None]] = []
        self.handles = [
            module.register_forward_pre_hook(self._enter),
            module.register_forward_hook(self._leave, always_call=True),
        ]

    def _enter(self, module: nn.Module, args: object) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        hooks.__enter__()
        self.hooks.append(hooks)

    def _leave(self, module: nn.Module, args: object, output: object) -> None:
        self.hooks.pop().__exit__(None, None, None)

    def _pack(self, tensor: torch.Tensor) -> _Holder:
        holder = _Holder(tensor)
        storage = _local(tensor).untyped_storage()
        key = storage._cdata
        if key in _running(self.module):
            return holder
        if key not in self.holders:
            self.holders[key] = 0
            self.nbytes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self.holders[key] += 1
        weakref.finalize(holder, self._release, key)
        return holder

    def _release(self, key: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.live -= self.nbytes.pop(key)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _unpack(holder: _Holder) -> torch.Tensor:
    return holder.tensor


def _pipe_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = nn.functional.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
    return loss


@contextlib.contextmanager
def _sends() -> Iterator[list[int]]:
    """The bytes of every tensor the pipeline schedules hand a send op while inside."""
    sent: list[int] = []
    original = schedules._batch_p2p

    def counting(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        sends = [op.tensor for op in p2p_ops if op.op is dist.isend]
        sent.extend(t.numel() * t.element_size() for t in sends)
        return original(p2p_ops, desc)

    schedules._batch_p2p = counting
    try:
        yield sent
    finally:
        schedules._batch_p2p = original


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under ``tensors`` (FSDP2's padded shards)."""
    seen = {_key(t): _local(t).untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _pipeline(schedule: str, microbatches: int, meshes: MeshFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    mesh = meshes(PIPE)
    pp = mesh["pp"].get_local_rank()
    chunk = _stage(PipeNet(), pp)
    fqns = sorted(name for name, _ in chunk.named_parameters())
    for layer in chunk.layers.values():
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(chunk, mesh=mesh["dp_shard"])
    stage = PipelineStage(chunk, pp, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    run = _SCHEDULES[schedule](stage, n_microbatches=microbatches, loss_fn=_pipe_loss)
    optimizer = torch.optim.AdamW(chunk.parameters(), lr=0.1)
    shape = (microbatches * MICROBATCH, PIPE_SEQ)
    tokens = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(1))
    # the first step also infers shapes, running the stage's forward once more; on the
    # first stage no backward frees that graph, which a holder and the saved output it
    # holds would keep alive for each other: the hooks go on the second step alone
    for step in range(2):
        held = HeldSaved(chunk) if step else None
        with _sends() as sent:
            if pp == 0:
                run.step(tokens)
            else:
                run.step(target=tokens)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert held is not None
    held.close()
    return {
        "fqns": fqns,
        "params": _storage_bytes(chunk.parameters()),
        "sent": sum(sent),
        "sends": len(sent),
        "held": held.peak,
    }


# ---------------------------------------------------------------------------------------
# expert parallelism (torchtitan)


def has_torchtitan() -> bool:
    return importlib.util.find_spec("torchtitan") is not None


_AC: Final = "torchtitan.distributed.activation_checkpoint"


def titan_moe() -> nn.Module:
    """torchtitan's Qwen3-MoE debug model with ``ep=2``'s sharding config, two layers of
    four experts, on the meta device: its SDPA attention (its flex attention refuses a
    backward on the CPU) and its router's round-robin routing (balanced load)."""
    from tests.torchtitan_runs import Run as TitanRun  # noqa: PLC0415 - torchtitan loads late
    from tests.torchtitan_runs import config, function_of, get, module  # noqa: PLC0415

    cfg = config(TitanRun("qwen3_moe", "partial_dtensor", tp=1, ep=2, experts=4))
    sdpa = get(module("torchtitan.models.common.attention"), "ScaledDotProductAttention.Config")
    layers = get(cfg, "layers")
    assert isinstance(layers, list)
    for layer in layers:
        inner = function_of(sdpa, "__call__")()
        object.__setattr__(get(layer, "attention"), "inner_attention", inner)
        object.__setattr__(get(layer, "moe.router"), "_debug_force_load_balance", True)
    with torch.device("meta"):
        built = function_of(cfg, "build")()
    assert isinstance(built, nn.Module)
    return built


def _experts(checkpointing: str) -> dict[str, Any]:
    """torchtitan's own EP on gloo, with its full activation checkpointing or none: one
    forward and backward, its exchanges counted."""
    from tests.torchtitan_runs import function, function_of, get, module  # noqa: PLC0415

    # torchtitan keeps its backend in a module global and builds meshes on its own
    # device type (cuda here); its CPU tests set both so
    setattr(module("torchtitan.distributed.utils"), "_spmd_backend", "partial_dtensor")  # noqa: B010
    setattr(module("torchtitan.distributed.parallel_dims"), "device_type", "cpu")  # noqa: B010
    torch.manual_seed(0)
    model = titan_moe()
    dims = function("torchtitan.distributed", "ParallelDims")(
        dp_replicate=1,
        dp_shard=-1,
        cp=1,
        tp=1,
        pp=1,
        ep=2,
        world_size=WORLD_SIZE,
        spmd_backend="partial_dtensor",
    )
    function_of(dims, "build_mesh")()
    function("torchtitan.models.qwen3", "parallelize_qwen3")(
        model,
        parallel_dims=dims,
        training=function("torchtitan.config", "TrainingConfig")(),
        parallelism=function("torchtitan.config", "ParallelismConfig")(
            expert_parallel_degree=2, spmd_backend="partial_dtensor"
        ),
        compile_config=function("torchtitan.config", "CompileConfig")(),
        ac_config=(
            function_of(get(module(_AC), "FullAC"), "Config")() if checkpointing == "full" else None
        ),
        dump_folder="",
    )
    for m in model.modules():
        if isinstance(m, FSDPModule):  # gloo has no PREMUL_SUM for torchtitan's divide factor
            m.set_force_sum_reduction_for_comms(True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "DTensor random operators", UserWarning)
        on_cpu(model)
    tokens = torch.arange(BATCH * SEQ).reshape(BATCH, SEQ) % 100
    collectives = Collectives()
    with collectives, warnings.catch_warnings():
        # torchtitan's router asks CPU autocast for float32, which it declines
        warnings.filterwarnings("ignore", "In CPU autocast", UserWarning)
        model(tokens).float().square().mean().backward()
    return {"collectives": collectives.bytes}


# ---------------------------------------------------------------------------------------


def scenario(rank: int, experts: bool) -> dict[str, Any]:
    meshes = MeshFactory(WORLD_SIZE)
    out: dict[str, Any] = {
        "dense": {name: _dense(run, meshes, rank) for name, run in RUNS.items()},
        "pipeline": {name: _pipeline(*what, meshes) for name, what in PIPELINES.items()},
    }
    if experts:
        out["experts"] = {policy: _experts(policy) for policy in ("none", "full")}
    return out


def run_all(*, experts: bool) -> list[dict[str, Any]]:
    """Every run on :data:`WORLD_SIZE` gloo ranks in one spawn; per rank, ``{"dense":
    {run: ...}, "pipeline": {run: ...}, "experts": ...}`` (``experts`` only if asked)."""
    return on_gloo(scenario, experts, world_size=WORLD_SIZE)
