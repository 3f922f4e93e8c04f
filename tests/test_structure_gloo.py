"""The rules inside a dim against the real thing: torch's tensor parallelism on gloo ranks.

Small attention and SwiGLU modules of our own (separate q/k/v, fused ``qkv``, GQA with
fewer KV heads than ranks, separate and fused ``gate_up``) are parallelized with torch's
``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``, and a colwise style that
shards a packed weight with ``_StridedShard``, as transformers' ``packed_colwise`` does).
The modules compute on their local shards, as torch's tensor-parallel recipes do (heads
counted from the local width, fused outputs split locally). On 4 CPU ranks each case's
distributed forward is compared with the single-process forward of the same weights;
each case's layouts, read back off the parallelized model (``table_from_module``), go
through the rules with the structure ``shapes_from_module`` reads. Every case the rules
pass computes the same output; every case they flag computes another one, or the module
cannot run on its shards.

``CASES`` is the table of cases with what the rules say of each; one spawn runs them all.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Final

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard

from layout_algebra._structure_rules import structure_problems
from layout_algebra.torch_bridge import shapes_from_module, table_from_module
from tests.torch_oracle import MeshFactory, on_gloo

WORLD_SIZE: Final = 4
DIM: Final = 16


class Attention(nn.Module):
    """Causal-free GQA attention over local heads: q, k, v separate or fused ``[q | k | v]``.

    Head counts are read from the local widths, as torch's recipes do; a fused output is
    split in the proportion of its parts (``heads : kv : kv``).
    """

    def __init__(self, heads: int, kv: int, head_dim: int, *, fused: bool) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.parts = (heads, kv, kv)
        self.config = SimpleNamespace(
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim
        )
        if fused:
            self.qkv_proj = nn.Linear(DIM, (heads + 2 * kv) * head_dim)
        else:
            self.q_proj = nn.Linear(DIM, heads * head_dim)
            self.k_proj = nn.Linear(DIM, kv * head_dim)
            self.v_proj = nn.Linear(DIM, kv * head_dim)
        self.o_proj = nn.Linear(heads * head_dim, DIM)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.fused:
            qkv = self.qkv_proj(x)
            total = sum(self.parts)
            width = qkv.shape[-1]
            q, k, v = qkv.split([width * n // total for n in self.parts], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (t.reshape(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v)
        result: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return result


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; fused, ``gate_up`` is ``[gate | up]``, split locally."""

    def __init__(self, hidden: int, *, fused: bool) -> None:
        super().__init__()
        if fused:
            self.gate_up_proj = nn.Linear(DIM, 2 * hidden, bias=False)
        else:
            self.gate_proj = nn.Linear(DIM, hidden, bias=False)
            self.up_proj = nn.Linear(DIM, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, DIM, bias=False)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        result: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return result


class PackedColwise(ColwiseParallel):
    """``ColwiseParallel`` whose weight (and bias) is ``_StridedShard(0, parts)``: each
    part of a packed output split on its own (transformers' ``packed_colwise``)."""

    def __init__(self, parts: int) -> None:
        super().__init__()
        self.parts = parts

    @staticmethod
    def _prepare_output_fn(
        output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: Any
    ) -> Any:
        # each rank keeps the rows it computed, [q_i | k_i | v_i]: no redistribution
        return outputs.to_local()

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
        for leaf, param in list(module.named_parameters(recurse=False)):
            # every rank holds the whole weight: each takes its rows (as transformers
            # does), which torch also does for parts its scatter cannot pad evenly
            placed = distribute_tensor(
                param, device_mesh, [_StridedShard(0, split_factor=self.parts)], src_data_rank=None
            )
            module.register_parameter(leaf, nn.Parameter(placed.to_local().new_empty(0)))
            module.register_parameter(leaf, nn.Parameter(placed))


# name, module, {child: style}, tp size, the problem kinds the rules find
CASES: Final[list[tuple[str, str, str, int, list[str]]]] = [
    ("MHA q/k/v over tp=4", "mha", "colwise", 4, []),
    ("GQA 2 KV heads over tp=2", "gqa", "colwise", 2, []),
    ("GQA 2 KV heads over tp=4", "gqa", "colwise", 4, ["cuts-unit"] * 4),  # k, v: w and b
    ("6 heads of 4 over tp=4", "six", "colwise", 4, ["cuts-unit"] * 7),  # q, k, v, o
    ("fused MHA qkv S(0) over tp=2", "mha-fused", "colwise", 2, ["packed-contiguous"]),
    ("fused MHA qkv _S(0, 3) over tp=2", "mha-fused", "packed", 2, []),
    ("fused MHA qkv _S(0, 3) over tp=4", "mha-fused", "packed", 4, []),
    ("fused GQA qkv S(0) over tp=2", "gqa-fused", "colwise", 2, ["packed-contiguous"]),
    ("SwiGLU gate/up over tp=4", "swiglu", "colwise", 4, []),
    ("fused gate_up S(0) over tp=2", "swiglu-fused", "colwise", 2, ["packed-contiguous"]),
    ("fused gate_up _S(0, 2) over tp=2", "swiglu-fused", "packed", 2, []),
    ("fused gate_up _S(0, 2) over tp=4", "swiglu-fused", "packed", 4, []),
]


def build(kind: str) -> nn.Module:
    match kind:
        case "mha" | "mha-fused":
            return Attention(4, 4, 4, fused=kind.endswith("fused"))
        case "gqa" | "gqa-fused":
            return Attention(4, 2, 4, fused=kind.endswith("fused"))
        case "six":
            return Attention(6, 6, 4, fused=False)
        case "swiglu" | "swiglu-fused":
            return SwiGLU(8, fused=kind.endswith("fused"))
    raise AssertionError(kind)


def plan(module: nn.Module, style: str) -> dict[str, Any]:
    """Colwise for what makes the heads (or the hidden features), rowwise for the rest."""
    out: dict[str, Any] = {}
    for name, _ in module.named_children():
        if name in ("o_proj", "down_proj"):
            out[name] = RowwiseParallel()
        elif style == "packed" and name == "qkv_proj":
            out[name] = PackedColwise(3)
        elif style == "packed" and name == "gate_up_proj":
            out[name] = PackedColwise(2)
        else:
            out[name] = ColwiseParallel()
    return out


def scenario(rank: int) -> list[dict[str, Any]]:
    meshes = MeshFactory(WORLD_SIZE)
    results: list[dict[str, Any]] = []
    for name, kind, style, tp, _ in CASES:
        torch.manual_seed(0)
        module = build(kind)
        x = torch.randn(2, 5, DIM)
        want = module(x)
        mesh = meshes({"tp": 4}) if tp == 4 else meshes({"dp": 2, "tp": 2})
        parallel = parallelize_module(copy.deepcopy(module), mesh["tp"], plan(module, style))
        try:
            got: torch.Tensor | None = parallel(x)
            refused = None
        except RuntimeError as e:  # the module cannot run on its shards
            got, refused = None, str(e).splitlines()[0]
        if isinstance(got, DTensor):
            got = got.full_tensor()
        equal = got is not None and got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
        table = table_from_module(parallel)
        shapes = shapes_from_module(module)
        sizes = dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
        kinds = [
            p.kind
            for fqn, layout in table.items()
            for p in structure_problems(layout, shapes[fqn], sizes)
        ]
        placements = {
            fqn: [str(p) for p in param.placements]
            for fqn, param in parallel.named_parameters()
            if isinstance(param, DTensor)
        }
        results.append(
            {
                "case": name,
                "equal": equal,
                "refused": refused,
                "kinds": kinds,
                "placements": placements,
            }
        )
    return results


@pytest.mark.distributed
def test_what_the_rules_pass_computes_right_and_what_they_flag_does_not() -> None:
    by_rank = on_gloo(scenario, world_size=WORLD_SIZE)
    wrong = []
    for i, (name, _, _, _, kinds) in enumerate(CASES):
        seen = [ranks[i] for ranks in by_rank]
        assert all(s["case"] == name for s in seen)
        right = all(s["equal"] for s in seen)
        if seen[0]["kinds"] != kinds or right == bool(kinds):
            wrong.append((name, right, seen[0]))
    assert not wrong, "\n".join(map(str, wrong))
