"""The reference algorithm on plain dicts and tuples, and the workload both sides run.

``resolve_plan`` is the original "source shard info" step (REFERENCE.md, cases 1-7) as a
competent engineer writes it with dicts and tuples: the owned-axis check stops at the
first problem, a parameter of an expert-parallel module with a ``Shard`` on ``ep`` goes
to the expert mesh, omitted axes are filled with ``Replicate()`` in source-axis order,
axes the mesh lacks are dropped silently, and tied pairs are fixed up one pair at a time.

``moe_plan`` builds the workload: a mixture-of-experts transformer plan of about ``n``
parameters, the way planners write plans, one dict per layout kind reused for every
parameter laid out alike. Both sides use the package's placement objects, so only the
algorithm differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeAlias, TypedDict

from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.placements import Placement, Replicate, Shard
from layout_algebra.plan import ModulePlan, ShardingPlan

__all__ = [
    "DENSE_AXES",
    "EXPERTS",
    "EXPERT_AXES",
    "MESH_AXES",
    "PARAMS_PER_LAYER",
    "TIED",
    "MeshKey",
    "ModuleSpec",
    "PlainPlan",
    "PlainTable",
    "fqns_of",
    "fresh_moe_plan",
    "moe_plan",
    "param_count",
    "pattern_plan",
    "resolve_plan",
    "sharding_plan",
]


class ModuleSpec(TypedDict):
    """One module of a plain plan: named placements by parameter path, and its EP size."""

    params: dict[str, Mapping[str, Placement]]
    ep_size: int


PlainPlan: TypeAlias = dict[str, ModuleSpec]
"""``{module_fqn: {"params": {param_path: {axis: placement}}, "ep_size": int}}``."""

MeshKey: TypeAlias = tuple[str, tuple[str, ...]] | None
"""The source sub-mesh a parameter lives on: the mesh role and its source axes, or none."""

PlainTable: TypeAlias = dict[str, tuple[tuple[Placement, ...], MeshKey]]
"""``{param_fqn: (placements, mesh_key)}``."""

_R: Final = Replicate()


# ---------------------------------------------------------------------------------------
# the original algorithm


def _source_axes(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(a for a in names if a not in FSDP_OWNED_AXES)


def _mesh_key(role: str, names: Sequence[str], source: tuple[str, ...]) -> MeshKey:
    # The mesh itself when nothing was stripped, nothing when no source axis is left,
    # else the slice over the source axes; a (role, axes) key stands for each.
    if not source:
        return None
    return (role, tuple(names)) if tuple(names) == source else (role, source)


def resolve_plan(
    plan: PlainPlan,
    dense_axes: Sequence[str],
    *,
    expert_axes: Sequence[str] | None = None,
    mesh_dim_names: Sequence[str] = (),
    tied_pairs: Iterable[tuple[str, str]] | None = None,
    plan_tied_pairs: Iterable[tuple[str, str]] = (),
) -> PlainTable:
    """Every parameter's placements on its source sub-mesh, as the original computed it.

    Raises:
        ValueError: the first non-Replicate placement on an owned axis, or a parameter
            routed to experts with no expert mesh.
    """
    dense_names = tuple(dense_axes) or tuple(mesh_dim_names)
    dense_source = _source_axes(dense_names)
    dense_key = _mesh_key("dense", dense_names, dense_source)
    expert_source: tuple[str, ...] = ()
    expert_key: MeshKey = None
    if expert_axes is not None:
        expert_names = tuple(expert_axes) or ("ep",)
        expert_source = _source_axes(expert_names)
        expert_key = _mesh_key("expert", expert_names, expert_source)

    owned = FSDP_OWNED_AXES
    result: PlainTable = {}
    for module, spec in plan.items():
        ep_size = spec["ep_size"]
        for path, named in spec["params"].items():
            fqn = f"{module}.{path}"
            for axis, p in named.items():
                if axis in owned and not isinstance(p, Replicate):
                    msg = (
                        f"{fqn}: placement {p} on axis {axis!r} conflicts with FSDP ownership "
                        "of that axis; declare Replicate or remove the axis"
                    )
                    raise ValueError(msg)
            if ep_size > 0 and isinstance(named.get("ep"), Shard):
                if expert_axes is None:
                    msg = f"{fqn}: routed to the expert mesh, but there is none"
                    raise ValueError(msg)
                source, key = expert_source, expert_key
            else:
                source, key = dense_source, dense_key
            result[fqn] = (tuple([named.get(a, _R) for a in source]), key)

    pairs = plan_tied_pairs if tied_pairs is None else tied_pairs
    for a, b in pairs:
        left, right = result.get(a), result.get(b)
        if left is None or right is None:
            continue
        (pa, key_a), (pb, key_b) = left, right
        if pa == pb or len(pa) != len(pb):
            continue
        fixed = tuple([x if isinstance(x, Shard) else y for x, y in zip(pa, pb, strict=True)])
        result[a] = (fixed, key_a)
        result[b] = (fixed, key_b)
    return result


# ---------------------------------------------------------------------------------------
# the workload

MESH_AXES: Final = ("dp_shard", "ep", "tp")
DENSE_AXES: Final = ("dp_shard", "tp")
EXPERT_AXES: Final = ("dp_shard", "ep", "tp")

# One dict per layout kind, reused for every parameter laid out alike, as planners do.
COLWISE: Final[Mapping[str, Placement]] = {"tp": Shard(0)}
ROWWISE: Final[Mapping[str, Placement]] = {"tp": Shard(1)}
NORM: Final[Mapping[str, Placement]] = {"tp": Replicate()}
GATE: Final[Mapping[str, Placement]] = {"dp_shard": Replicate()}
EXPERT_COL: Final[Mapping[str, Placement]] = {"ep": Shard(0), "tp": Shard(2)}
EXPERT_ROW: Final[Mapping[str, Placement]] = {"ep": Shard(0), "tp": Shard(1)}
VOCAB: Final[Mapping[str, Placement]] = {"tp": Shard(0)}

_ATTENTION: Final = {
    "wq.weight": COLWISE,
    "wk.weight": COLWISE,
    "wv.weight": COLWISE,
    "wo.weight": ROWWISE,
}
_MOE: Final = {
    "router.gate.weight": GATE,
    "experts.w1": EXPERT_COL,
    "experts.w2": EXPERT_ROW,
    "experts.w3": EXPERT_COL,
    "shared_expert.w1.weight": COLWISE,
    "shared_expert.w2.weight": ROWWISE,
    "shared_expert.w3.weight": COLWISE,
}
PARAMS_PER_LAYER: Final = len(_ATTENTION) + len(_MOE) + 2
TIED: Final = (("tok_embeddings.weight", "output.weight"),)


def moe_plan(n: int) -> PlainPlan:
    """A plain-dict plan of a mixture-of-experts transformer with about ``n`` parameters.

    Per layer: attention q/k/v column-wise and o row-wise, two replicated norms, a
    replicated router gate, routed experts w1/w2/w3 on ``ep`` and ``tp``, and a column/
    row-wise shared expert; around them the embedding (tied to the LM head), the final
    norm and the head.
    """
    layers = max(1, (n - 3) // PARAMS_PER_LAYER)
    plan: PlainPlan = {"tok_embeddings": {"params": {"weight": VOCAB}, "ep_size": 0}}
    for i in range(layers):
        prefix = f"layers.{i}"
        plan[f"{prefix}.attention"] = {"params": dict(_ATTENTION), "ep_size": 0}
        plan[f"{prefix}.attention_norm"] = {"params": {"weight": NORM}, "ep_size": 0}
        plan[f"{prefix}.ffn_norm"] = {"params": {"weight": NORM}, "ep_size": 0}
        plan[f"{prefix}.moe"] = {"params": dict(_MOE), "ep_size": 8}
    plan["norm"] = {"params": {"weight": NORM}, "ep_size": 0}
    plan["output"] = {"params": {"weight": VOCAB}, "ep_size": 0}
    return plan


def param_count(plan: PlainPlan) -> int:
    """How many parameters ``plan`` lays out."""
    return sum(len(spec["params"]) for spec in plan.values())


def sharding_plan(plan: PlainPlan) -> ShardingPlan:
    """The same plan as the package's input, built from the very same dicts."""
    modules: dict[str, ModulePlan] = {}
    for module, spec in plan.items():
        modules[module] = ModulePlan(spec["params"], expert_parallel=spec["ep_size"] > 0)
    return ShardingPlan(modules, mesh_axes=MESH_AXES, tied_pairs=TIED)


# ---------------------------------------------------------------------------------------
# the planner that writes a new dict per parameter, and the same model by pattern

EXPERTS: Final = 64


def fresh_moe_plan(n: int, experts: int = EXPERTS) -> PlainPlan:
    """The plan of ``moe_plan(n)`` as a planner looping over modules writes it.

    Every parameter gets a new dict with new placement objects (``{"tp": Shard(0)}``
    spelled out per parameter), as code that walks the model and fills in each module's
    plan does; ``experts`` routed experts per MoE layer (the ``ep`` group's size).
    """
    layers = max(1, (n - 3) // PARAMS_PER_LAYER)
    plan: PlainPlan = {"tok_embeddings": {"params": {"weight": {"tp": Shard(0)}}, "ep_size": 0}}
    for i in range(layers):
        prefix = f"layers.{i}"
        plan[f"{prefix}.attention"] = {
            "params": {
                "wq.weight": {"tp": Shard(0)},
                "wk.weight": {"tp": Shard(0)},
                "wv.weight": {"tp": Shard(0)},
                "wo.weight": {"tp": Shard(1)},
            },
            "ep_size": 0,
        }
        plan[f"{prefix}.attention_norm"] = {
            "params": {"weight": {"tp": Replicate()}},
            "ep_size": 0,
        }
        plan[f"{prefix}.ffn_norm"] = {"params": {"weight": {"tp": Replicate()}}, "ep_size": 0}
        plan[f"{prefix}.moe"] = {
            "params": {
                "router.gate.weight": {"dp_shard": Replicate()},
                "experts.w1": {"ep": Shard(0), "tp": Shard(2)},
                "experts.w2": {"ep": Shard(0), "tp": Shard(1)},
                "experts.w3": {"ep": Shard(0), "tp": Shard(2)},
                "shared_expert.w1.weight": {"tp": Shard(0)},
                "shared_expert.w2.weight": {"tp": Shard(1)},
                "shared_expert.w3.weight": {"tp": Shard(0)},
            },
            "ep_size": experts,
        }
    plan["norm"] = {"params": {"weight": {"tp": Replicate()}}, "ep_size": 0}
    plan["output"] = {"params": {"weight": {"tp": Shard(0)}}, "ep_size": 0}
    return plan


def fqns_of(plan: PlainPlan) -> list[str]:
    """Every parameter FQN of ``plan``, in its order: the model's ``named_parameters``."""
    return [f"{module}.{path}" for module, spec in plan.items() for path in spec["params"]]


def pattern_plan() -> ShardingPlan:
    """The plan of ``moe_plan`` written once by pattern: 7 module keys, 16 parameter rules.

    ``layers.*.attention`` and the like match every layer; with the model's FQNs
    (``fqns_of``) it gives the same table as ``sharding_plan(moe_plan(n))``.
    """
    layer = {
        "attention": ModulePlan(_ATTENTION),
        "attention_norm": ModulePlan({"weight": NORM}),
        "ffn_norm": ModulePlan({"weight": NORM}),
        "moe": ModulePlan(_MOE, expert_parallel=True),
    }
    modules: dict[str, ModulePlan] = {
        "tok_embeddings": ModulePlan({"weight": VOCAB}),
        **{f"layers.*.{name}": spec for name, spec in layer.items()},
        "norm": ModulePlan({"weight": NORM}),
        "output": ModulePlan({"weight": VOCAB}),
    }
    return ShardingPlan(modules, mesh_axes=MESH_AXES, tied_pairs=TIED)
