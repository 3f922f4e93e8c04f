"""transformers' own tensor- and expert-parallel plans, read as the package's ``ShardingPlan``.

A transformers model carries its plans: ``model.tp_plan`` and ``model.ep_plan`` map
module or parameter names, layer numbers written ``*`` (``model.layers.*.mlp.up_proj``),
to style names (``"colwise"``, ``"packed_colwise"``, ``"grouped_gemm"``, ...). When
``from_pretrained(..., distributed_config=...)`` shards a model it resolves them the way
``plan_from_hf`` does:

- expert parallelism on, its rules win: every tensor-parallel rule on a module that has
  an expert-parallel rule, or on anything under it, is dropped;
- each module and parameter of the model takes the rule its name (layer numbers as
  ``*``) names; a parameter with no rule of its own takes its module's;
- each parameter rule places the parameter on the plan's mesh (the ``tp`` mesh for the
  tensor-parallel plan, the ``ep`` mesh for the expert-parallel one), by the style's own
  rule and the parameter's rank: ``colwise`` ``S(ndim - 2)`` (a bias ``S(0)``, a 3-D expert
  weight ``S(1)``), ``rowwise`` ``S(ndim - 1)`` and its bias ``R``, ``embedding_rowwise``
  ``S(0)``, ``packed_colwise`` ``_S(ndim - 2, 2)`` (gate and up halves each split),
  ``grouped_gemm`` ``S(0)`` (whole experts per rank); styles that only hook the forward
  (``moe_tp_experts``, ``replicated_with_grad_allreduce``, ``replicate``, ...) leave the
  parameter a plain tensor; a ``sequence_parallel`` module's parameters become ``R``;
- after loading, tied weights are tied again: the tied target (``lm_head.weight``) becomes
  its source's parameter (``model.embed_tokens.weight``), whatever its own rule said.

The package never imports transformers: everything is read off the model object
(``tp_plan``, ``ep_plan``, ``all_tied_weights_keys``, its modules and parameters).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeAlias

from torch import nn

from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.placements import (
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)
from layout_algebra.plan import ShardingPlan, param_fqn
from layout_algebra.torch_bridge._plans import Problems, check_module, shard_dim, sharding_plan

__all__ = ["KNOWN_STYLES", "plan_from_hf"]

_Rule: TypeAlias = Callable[[str, int], Placement | int | None]
"""A style's placement for a parameter, from its name and rank: a placement, or a
``Shard`` dim still to be counted from 0 (``-1`` is the last), or ``None`` (plain)."""

_R: Final = Replicate()


def _colwise(_: str, ndim: int) -> int:
    return ndim - 2  # a Linear's output rows; dim 1 of a 3-D expert weight; a bias's dim 0


def _rowwise(leaf: str, _: int) -> Placement | int:
    return _R if leaf == "bias" else -1  # added after the reduction, so whole


def _packed_colwise(_: str, ndim: int) -> Placement | int:
    # gate and up stacked on the output dim: each rank takes its part of both halves
    return 0 if ndim == 1 else StridedShard(ndim - 2, split_factor=2)


def _packed_rowwise(_: str, ndim: int) -> Placement | None:
    return _R if ndim == 1 else StridedShard(ndim - 1, split_factor=2)


def _shard(dim: int) -> _Rule:
    def rule(_: str, __: int) -> int:
        return dim

    return rule


def _plain(_: str, __: int) -> None:
    return None


_PARAM_RULES: Final[Mapping[str, _Rule]] = {
    "colwise": _colwise,
    "colwise_rep": _colwise,
    "colwise_gather_output": _colwise,
    "rowwise": _rowwise,
    "rowwise_rep": _rowwise,
    "rowwise_split_input": _rowwise,
    "embedding_rowwise": _shard(0),
    "embedding_colwise": _shard(1),
    "packed_colwise": _packed_colwise,
    "packed_rowwise": _packed_rowwise,
    "grouped_gemm": _shard(0),
    "sequence_parallel": _plain,
    "replicated_with_grad_allreduce": _plain,
    "mla_kv_a_proj": _plain,
    "all_reduce": _plain,
    "moe_tp_experts": _plain,
    "moe_identity_expert": _plain,
    "local_params": _plain,
    "replicate": _plain,
    "ep_dispatch_experts": _plain,
}
"""What each style transformers registers does to a parameter it names."""

KNOWN_STYLES: Final = frozenset(_PARAM_RULES)
"""The style names ``plan_from_hf`` reads: those transformers 5 registers."""

_REPLICATES_MODULE: Final = frozenset({"sequence_parallel"})
"""Styles that, on a module, make each of its own parameters a replicated DTensor."""

_REMOVED_FROM_EP: Final = frozenset({"ep_router", "moe_tp_experts"})


def _wildcards(name: str) -> str:
    """``name`` with its layer numbers as ``*``: ``model.layers.3.mlp`` -> ``model.layers.*.mlp``.

    As transformers reads names: a dotted segment of digits after the first is a layer
    number, except right after another one (``a.0.1.b`` -> ``a.*.1.b``).
    """
    parts = name.split(".")
    out = parts[:1]
    replaced = False
    for part in parts[1:]:
        replaced = part.isdecimal() and not replaced
        out.append("*" if replaced else part)
    return ".".join(out)


def _rule_of(name: str, plan: Mapping[str, str], *, param: bool) -> str | None:
    """The style ``plan`` gives ``name``: its own rule, else (a parameter) its module's."""
    generic = _wildcards(name)
    found = plan.get(generic)
    if found is None and param and "." in generic:
        found = plan.get(generic.rpartition(".")[0])
    return found


def _read_plan(model: nn.Module, attr: str, problems: Problems) -> dict[str, str]:
    raw: object = getattr(model, attr, None)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.add(f"model.{attr} must map names to style names, got {quote(raw)}")
        return {}
    plan: dict[str, str] = {}
    for key, style in raw.items():
        if not isinstance(key, str) or not isinstance(style, str):
            msg = f"model.{attr}: {quote(key)}: {quote(style)} is not a name and a style name"
            problems.add(msg)
            continue
        if style not in KNOWN_STYLES:
            msg = (
                f"model.{attr}[{key!r}]: style {style!r} is not one transformers registers "
                f"(known: {', '.join(sorted(KNOWN_STYLES))}); fix the style name, or plan "
                "these parameters by hand"
            )
            problems.add(msg, fqn=key)
            continue
        plan[key] = style
    return plan


def _expand(model: nn.Module, plan: Mapping[str, str]) -> dict[str, str]:
    """One rule per module and parameter of ``model``, parameters before their module."""
    out: dict[str, str] = {}
    if not plan:
        return out
    for path, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            fqn = param_fqn(path, leaf)
            style = _rule_of(fqn, plan, param=True)
            if style is not None:
                out[fqn] = style
        style = _rule_of(path, plan, param=False)
        if style is not None:
            out[path] = style
    return out


class _Placer:
    """Each parameter's placement as transformers' styles give it, rule by rule."""

    def __init__(self, model: nn.Module, problems: Problems) -> None:
        self.problems = problems
        self.params: dict[str, nn.Parameter] = dict(model.named_parameters(remove_duplicate=False))
        self.modules: dict[str, nn.Module] = dict(model.named_modules())
        self.placed: dict[str, tuple[str, Placement, str]] = {}  # fqn -> (axis, placement, key)

    def apply(self, plan: Mapping[str, str], axis: AxisName, which: str) -> None:
        for name, style in plan.items():
            param = self.params.get(name)
            if param is not None:
                self.param(name, param, style, axis, which)
                continue
            module = self.modules.get(name)
            if module is not None and style in _REPLICATES_MODULE:
                for leaf, _ in module.named_parameters(recurse=False):
                    self.place(param_fqn(name, leaf), _R, axis, f"{which}[{name!r}] {style!r}")

    def param(self, fqn: str, param: nn.Parameter, style: str, axis: AxisName, which: str) -> None:
        rule = _PARAM_RULES[style](fqn.rpartition(".")[2], param.ndim)
        if rule is None:
            return
        placement: Placement
        if isinstance(rule, int):
            dim = shard_dim(rule, param.ndim)
            if dim is None:
                msg = (
                    f"{fqn}: style {style!r} ({which}) shards dim {rule} of a parameter with "
                    f"{param.ndim} dim(s), which it does not have; give it another style"
                )
                self.problems.add(msg, fqn=fqn)
                return
            placement = Shard(dim)
        else:
            placement = rule
        self.place(fqn, placement, axis, f"{which} style {style!r}")

    def place(self, fqn: str, p: Placement, axis: AxisName, source: str) -> None:
        earlier = self.placed.get(fqn)
        if earlier is not None:
            msg = (
                f"{fqn}: {source} places it {format_placement(p)} on {axis.name!r}, but "
                f"{earlier[2]} already placed it {format_placement(earlier[1])} on "
                f"{earlier[0]!r} (transformers fails distributing it twice); give it one rule"
            )
            self.problems.add(msg, fqn=fqn, placement=format_placement(p))
            return
        self.placed[fqn] = (axis.name, p, source)


def _active(axis: AxisLike | None, axes: tuple[AxisName, ...], arg: str) -> AxisName | None:
    """``axis`` when it is one of ``axes`` (its plan is read), else ``None``."""
    if axis is None:
        return None
    try:
        name = as_axis(axis)
    except LayoutError as e:
        msg = f"plan_from_hf({arg}=...): {e.message}; give an axis name, or None"
        raise LayoutError(msg) from None
    return name if name in axes else None


NEWEST_KNOWN: Final = (5, 24)
"""The newest transformers (major, minor) whose parallel styles ``KNOWN_STYLES`` mirrors.
5.25 renamed and re-meant some (``moe_tp_experts`` shards the experts over tp there)."""


def _check_version(transformers: object) -> None:
    """Refuse a transformers newer than the styles this module knows: its plans would be
    read by the old styles' meaning, silently wrong."""
    version = getattr(transformers, "__version__", None)
    if not isinstance(version, str):
        return  # not imported (a model that only looks like one): read what it holds
    parts = version.split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return
    if release > NEWEST_KNOWN:
        known = ".".join(map(str, NEWEST_KNOWN))
        msg = (
            f"plan_from_hf: transformers {clip(version)} is newer than {known}, the newest "
            "whose tensor-parallel styles this version of layout_algebra knows (5.25 changed "
            f"their names and meaning); install transformers<={known}.* or write the "
            "ShardingPlan"
        )
        raise LayoutError(msg)


def plan_from_hf(
    model: nn.Module,
    *,
    tp_axis: AxisLike | None = "tp",
    ep_axis: AxisLike | None = "ep",
    mesh_axes: Iterable[AxisLike],
) -> ShardingPlan:
    """The ``ShardingPlan`` giving each parameter what transformers' own parallelism gives it.

    The model's ``tp_plan`` is read when ``tp_axis`` is one of ``mesh_axes``, its
    ``ep_plan`` when ``ep_axis`` is (pass ``None`` to read no plan for an axis, as for a
    transformers mesh whose ``ep`` has size 1). The result is what
    ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=..., ep_size=...))``
    makes of the model: tensor-parallel placements on ``tp_axis``; expert weights
    ``S(0)`` on ``ep_axis`` in ``expert_parallel`` modules (``build_table`` routes them to
    the expert mesh when ``ep_axis`` is ``"ep"``); tied targets tied to their source
    (``tied_pairs``); parameters no rule shards left out (plain tensors:
    ``complete_default(..., plain=True)`` completes them). Rules that name nothing in the
    model are skipped, as transformers skips them (it warns).

    Args:
        model: a transformers model (``PreTrainedModel``), e.g. built from its config on
            the meta device.
        tp_axis: the axis of the tensor-parallel mesh, or ``None``.
        ep_axis: the axis of the expert-parallel mesh, or ``None``.
        mesh_axes: the run's axis names, for the plan's ``mesh_axes``.

    Returns:
        One ``{axis: placement}`` per parameter a rule places, in the model's order.

    Raises:
        LayoutError: ``model`` is not an ``nn.Module``, or has neither ``tp_plan`` nor
            ``ep_plan``, or the transformers imported is newer than ``NEWEST_KNOWN``
            (its styles would be read with the wrong meaning).
        PlanError: every problem at once, each naming the rule or parameter and the
            style: a style transformers does not register, a removed expert style in the
            ``ep_plan``, an axis read whose plan is empty, a shard dim the parameter lacks,
            a parameter two rules place, a tied name that is not a parameter.
    """
    root = check_module(model, "plan_from_hf(model=...)")
    _check_version(sys.modules.get("transformers"))
    if not hasattr(root, "tp_plan") and not hasattr(root, "ep_plan"):
        msg = (
            f"plan_from_hf(model=...): a {type(root).__qualname__} has neither tp_plan nor "
            "ep_plan, so it is not a transformers model; use plan_from_parallelize for a "
            "torch plan, or write the ShardingPlan"
        )
        raise LayoutError(msg)
    axes = as_axes(mesh_axes, "plan_from_hf(mesh_axes=...)")
    tp = _active(tp_axis, axes, "tp_axis")
    ep = _active(ep_axis, axes, "ep_axis")
    problems = Problems("plan_from_hf")
    tp_rules = _read_plan(root, "tp_plan", problems) if tp is not None else {}
    ep_rules = _read_plan(root, "ep_plan", problems) if ep is not None else {}
    for axis, rules, which in ((tp, tp_rules, "tp_plan"), (ep, ep_rules, "ep_plan")):
        if axis is not None and not rules:
            arg = "tp_axis" if which == "tp_plan" else "ep_axis"
            msg = (
                f"{arg}={axis.name!r} is one of mesh_axes, but the model's {which} is empty "
                f"(transformers refuses that size > 1); pass {arg}=None when this run has "
                "no such parallelism, or set the model's plan"
            )
            problems.add(msg)
    for key, style in ep_rules.items():
        if style in _REMOVED_FROM_EP:
            msg = (
                f"model.ep_plan[{key!r}]: style {style!r} does not belong in an ep_plan "
                "(transformers refuses it); shard experts with 'ep_dispatch_experts' and "
                "'grouped_gemm'"
            )
            problems.add(msg, fqn=key)
    # Expert parallelism's rules win over tensor parallelism's on their modules.
    tp_rules = {
        key: style
        for key, style in tp_rules.items()
        if not any(key == e or key.startswith(f"{e}.") for e in ep_rules)
    }
    placer = _Placer(root, problems)
    if tp is not None:
        placer.apply(_expand(root, tp_rules), tp, "tp_plan")
    if ep is not None:
        placer.apply(_expand(root, ep_rules), ep, "ep_plan")

    tied: list[tuple[str, str]] = []
    raw_tied: object = getattr(root, "all_tied_weights_keys", None) or {}
    if not isinstance(raw_tied, Mapping):
        problems.add(f"model.all_tied_weights_keys must map names to names, got {quote(raw_tied)}")
        raw_tied = {}
    assert isinstance(raw_tied, Mapping)
    for target, source in raw_tied.items():
        missing = [n for n in (target, source) if n not in placer.params]
        if missing:
            msg = (
                f"model.all_tied_weights_keys ties {quote(target)} to {quote(source)}, but "
                f"{quote(missing[0])} is not a parameter of the model; fix the model's tied "
                "weights"
            )
            problems.add(msg, fqn=str(missing[0]))
            continue
        placer.placed.pop(target, None)  # tied again after loading: the source's parameter
        tied.append((source, target))
    problems.raise_any()

    placements: dict[str, dict[str, Placement]] = {}
    expert: set[str] = set()
    for fqn in placer.params:
        found = placer.placed.get(fqn)
        if found is None:
            continue
        on, p, _ = found
        placements[fqn] = {on: p}
        if ep is not None and on == ep.name and isinstance(p, Shard):
            expert.add(fqn.rpartition(".")[0])
    return sharding_plan(placements, expert=expert, mesh_axes=axes, tied_pairs=tied)
