"""``training_cost`` against the real thing: FSDP2 and AdamW / SGD on 4 gloo ranks.

A small model (an embedding and a head of 11 rows, which FSDP shards unevenly, and a
``layers`` ModuleList of two MLP blocks) is wrapped by torch's own ``fully_shard`` per
layer and at the root, and trained one real step: plain FSDP over 4 ranks in bf16 mixed
precision (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``) with
AdamW; tensor parallelism (``parallelize_module``) on a ``dp_shard=2 x tp=2`` mesh,
``reshard_after_forward=False``, AdamW; HSDP on ``dp_replicate=2 x dp_shard=2`` with SGD
and momentum; transformers' own Llama (two layers, bf16 compute); and experts on an
expert mesh (``ep=2``, FSDP over ``efsdp=2``) as units inside layers sharded over
``dp_shard=4``, as torchtitan wraps them; the embedding and the first layer frozen, with
Adagrad (which makes state for frozen parameters too). The prediction is built from the source
layouts (``table_from_module`` before FSDP, the experts' by hand) composed by the
package, never from what torch made of it.

On every rank: the storage FSDP2 allocates for the parameters and their gradients (the
distinct storages under ``to_local()``: padded shards, a unit's gradients one flat
buffer) and the local bytes of the optimizer's state (``optimizer.state[p]``, ``step``
included) equal ``by_kind``; the bytes through the collectives FSDP2 calls in this torch
(``dist.all_gather_single``, ``dist.reduce_scatter_single``, ``dist.all_reduce``), counted
by wrapping them for the step, equal ``traffic``; and the largest all-gather output equals
``largest_buffer``. Beside them, torch's Adafactor and Rprop are stepped on FSDP2's
parameters to pin that they fail there (the package refuses their names). One spawn
runs every case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from layout_algebra import ParamLayoutTable, Shard, SourceLayout, compose_table
from layout_algebra.torch_bridge import shapes_from_module, table_from_module
from layout_algebra.training import Training, TrainingCost, training_cost
from tests.torch_oracle import MeshFactory, on_gloo

WORLD_SIZE: Final = 4
VOCAB: Final = 11
DIM: Final = 8
HIDDEN: Final = 12
MOE: Final = "experts on their own mesh, AdamW"
REFUSED: Final = "optimizers refused"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.w2(torch.relu(self.w1(x)))
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.head(h)
        return out


def tiny_llama() -> nn.Module:
    """transformers' Llama with two layers of width 16 and a vocabulary of ``VOCAB``."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - only this case

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model: nn.Module = LlamaForCausalLM(config)
    return model


_COLLECTIVES: Final = {
    "all_gather_single": ("all_gather", "output_tensor", 0),
    "all_gather_into_tensor": ("all_gather", "output_tensor", 0),
    "reduce_scatter_single": ("reduce_scatter", "input", 1),
    "reduce_scatter_tensor": ("reduce_scatter", "input", 1),
    "all_reduce": ("all_reduce", "tensor", 0),
}
"""What each wrapped function moves: its kind, and the argument holding the buffer
counted (the gathered output, the scattered input, the reduced tensor) by name and
position."""


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under ``tensors``: what is allocated for them
    (FSDP2's padded shards; a unit's gradients are views of one flat storage)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@contextmanager
def counting() -> Iterator[dict[str, list[int]]]:
    """Every buffer the wrapped ``torch.distributed`` collectives move, by kind."""
    seen: dict[str, list[int]] = {"all_gather": [], "reduce_scatter": [], "all_reduce": []}
    saved = {name: getattr(dist, name) for name in _COLLECTIVES}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        kind, arg, at = _COLLECTIVES[name]

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tensor = kwargs[arg] if arg in kwargs else args[at]
            seen[kind].append(_nbytes(tensor))
            return fn(*args, **kwargs)

        return wrapped

    for name, fn in saved.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _case(
    rank: int,
    meshes: MeshFactory,
    sizes: dict[str, int],
    *,
    tp: bool,
    fsdp: str | tuple[str, str],
    training: Training,
    llama: bool = False,
) -> dict[str, Any]:
    torch.manual_seed(0)
    model: nn.Module = tiny_llama() if llama else Net()
    layers: nn.ModuleList = model.get_submodule("model.layers" if llama else "layers")  # type: ignore[assignment]
    world = meshes(sizes)
    if tp:
        plan = {"layers.*.w1": ColwiseParallel(), "layers.*.w2": RowwiseParallel()}
        parallelize_module(model, world["tp"], plan)
    for fqn, param in model.named_parameters():  # Training(frozen=...) names modules here
        if any(fqn.startswith(f"{module}.") for module in training.frozen):
            param.requires_grad_(False)
    source = table_from_module(model)
    shapes = shapes_from_module(model)
    fsdp_mesh = world[fsdp]
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, training.param_dtype) if training.param_dtype else None,
        reduce_dtype=getattr(torch, training.reduce_dtype) if training.reduce_dtype else None,
    )
    options: dict[str, Any] = {"mesh": fsdp_mesh, "mp_policy": policy}
    if not training.reshard_after_forward:
        options["reshard_after_forward"] = False
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    made: dict[object, Callable[[], torch.optim.Optimizer]] = {
        "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=0.1),
        "sgd": lambda: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        "adagrad": lambda: torch.optim.Adagrad(model.parameters(), lr=0.1),
    }
    optimizer = made[training.optimizer]()

    measured = _step_bytes(model, optimizer, logits=llama)
    composed = compose_table(source, fsdp={"dense": fsdp}, mesh_sizes={"dense": sizes})
    cost = training_cost(composed, shapes, {"dense": sizes}, training, tied=composed.tied)
    return {"measured": measured, "predicted": _predicted(cost, rank)}


def _step_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, logits: bool
) -> dict[str, int]:
    """One training step's bytes on this rank: held after it, and moved during it."""
    tokens = torch.arange(12).reshape(2, 6) % VOCAB
    with counting() as seen:
        out = model(tokens)
        loss = (out.logits if logits else out).float().square().mean()
        loss.backward()
        optimizer.step()
    params = list(model.parameters())
    return {
        "params": _storage_bytes(params),
        "grads": _storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": sum(
            _nbytes(v)
            for p in params
            for v in optimizer.state[p].values()
            if isinstance(v, torch.Tensor)
        ),
        **{kind: sum(found) for kind, found in seen.items()},
        "largest": max(seen["all_gather"], default=0),
    }


def _predicted(cost: TrainingCost, rank: int) -> dict[str, int]:
    return {
        **{kind: cost.by_kind[kind][rank] for kind in ("params", "grads", "optimizer")},
        **{kind: row[rank] for kind, row in cost.traffic.items()},
        "largest": cost.largest_buffer[rank],
    }


class Experts(nn.Module):
    """Four experts of one matrix each; each rank computes with its local experts, as
    torch's expert-parallel recipes do."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, DIM, DIM) / DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.to_local() if isinstance(self.w, DTensor) else self.w
        out: torch.Tensor = x @ w.sum(0)
        return out


class Moe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = Experts()


class MoeBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.moe = Moe()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = super().forward(x) + self.moe.experts(x)
        return out


def _moe_case(rank: int, meshes: MeshFactory) -> dict[str, Any]:
    """Experts over ``ep=2`` and FSDP over ``efsdp=2``, the rest over ``dp_shard=4``, each
    layer's experts a unit of their own inside the layer's, as torchtitan wraps them."""
    torch.manual_seed(0)
    model = Net()
    blocks = [MoeBlock(), MoeBlock()]
    model.layers = nn.ModuleList(blocks)
    sizes = {"dense": {"dp_shard": 4}, "expert": {"efsdp": 2, "ep": 2}}
    dense, expert = meshes(sizes["dense"]), meshes(sizes["expert"])
    table = ParamLayoutTable(
        {
            fqn: SourceLayout("expert", ["ep"], [Shard(0)])
            if ".experts." in fqn
            else SourceLayout("dense", (), ())
            for fqn, _ in model.named_parameters()
        }
    )
    shapes = shapes_from_module(model)
    for layer in blocks:
        experts = layer.moe.experts
        experts.w = nn.Parameter(distribute_tensor(experts.w.data, expert["ep"], [TorchShard(0)]))
        fully_shard(experts, mesh=expert["efsdp"])
        fully_shard(layer, mesh=dense)
    fully_shard(model, mesh=dense)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    measured = _step_bytes(model, optimizer, logits=False)
    composed = compose_table(table, fsdp={"dense": "dp_shard", "expert": "efsdp"}, mesh_sizes=sizes)
    training = Training(units=["layers.*", "layers.*.moe.experts"])
    cost = training_cost(composed, shapes, sizes, training)
    return {"measured": measured, "predicted": _predicted(cost, rank)}


CASES: Final[dict[str, dict[str, Any]]] = {
    "fsdp, bf16 mixed precision, AdamW": {
        "sizes": {"dp_shard": 4},
        "tp": False,
        "fsdp": "dp_shard",
        "training": Training(param_dtype="bfloat16", reduce_dtype="float32", units=["layers.*"]),
    },
    "fsdp x tp, no reshard after forward, AdamW": {
        "sizes": {"dp_shard": 2, "tp": 2},
        "tp": True,
        "fsdp": "dp_shard",
        "training": Training(units=["layers.*"], reshard_after_forward=False),
    },
    "transformers Llama, bf16 mixed precision, AdamW": {
        "sizes": {"dp_shard": 4},
        "tp": False,
        "fsdp": "dp_shard",
        "llama": True,
        "training": Training(param_dtype="bfloat16", units=["model.layers.*"]),
    },
    "hsdp, SGD with momentum": {
        "sizes": {"dp_replicate": 2, "dp_shard": 2},
        "tp": False,
        "fsdp": ("dp_replicate", "dp_shard"),
        "training": Training(optimizer="sgd", units=["layers.*"]),
    },
    # Adagrad makes its state for the frozen parameters too; backward never reaches the
    # first layer, but the second prefetches it
    "fsdp, frozen embedding and first layer, Adagrad": {
        "sizes": {"dp_shard": 4},
        "tp": False,
        "fsdp": "dp_shard",
        "training": Training(optimizer="adagrad", units=["layers.*"], frozen=["emb", "layers.0"]),
    },
}


def _refused(meshes: MeshFactory) -> dict[str, str]:
    """What torch's Adafactor and Rprop raise on FSDP2's sharded parameters, by name
    (``""``: their step ran)."""
    raised: dict[str, str] = {}
    for name, make in (
        ("adafactor", lambda ps: torch.optim.Adafactor(ps, lr=0.1)),
        ("rprop", lambda ps: torch.optim.Rprop(ps, lr=0.1)),
    ):
        torch.manual_seed(0)
        model = Net()
        for layer in model.layers:
            fully_shard(layer, mesh=meshes({"dp_shard": WORLD_SIZE})["dp_shard"])
        fully_shard(model, mesh=meshes({"dp_shard": WORLD_SIZE})["dp_shard"])
        optimizer: torch.optim.Optimizer = make(list(model.parameters()))
        model(torch.arange(12).reshape(2, 6) % VOCAB).square().mean().backward()
        try:
            optimizer.step()
            raised[name] = ""
        except Exception as e:  # any failure of its step is the answer
            raised[name] = type(e).__name__
    return raised


def scenario(rank: int) -> dict[str, dict[str, Any]]:
    meshes = MeshFactory(WORLD_SIZE)
    results = {
        name: _case(
            rank,
            meshes,
            case["sizes"],
            tp=case["tp"],
            fsdp=case["fsdp"],
            training=case["training"],
            llama=case.get("llama", False),
        )
        for name, case in CASES.items()
    }
    results[MOE] = _moe_case(rank, meshes)
    results[REFUSED] = {"raised": _refused(meshes)}
    return results


@pytest.mark.distributed
def test_training_cost_equals_fsdp2_and_the_optimizer_on_every_rank() -> None:
    by_rank = on_gloo(scenario, world_size=WORLD_SIZE)
    # torch's Adafactor and Rprop fail on FSDP2's parameters: the names are refused
    for results in by_rank:
        assert all(results.pop(REFUSED)["raised"].values()), results
    wrong = [
        (name, rank, got["measured"], got["predicted"])
        for rank, results in enumerate(by_rank)
        for name, got in results.items()
        if got["measured"] != got["predicted"]
    ]
    assert not wrong, "\n".join(map(str, wrong))
    # every case moves bytes through FSDP2's collectives; HSDP's through all_reduce too
    for name in [*CASES, MOE]:
        measured = [results[name]["measured"] for results in by_rank]
        assert all(m["all_gather"] > 0 and m["reduce_scatter"] > 0 for m in measured), name
        assert all((m["all_reduce"] > 0) == name.startswith("hsdp") for m in measured), name
