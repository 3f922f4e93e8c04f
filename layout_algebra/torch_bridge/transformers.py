"""transformers' own tensor- and expert-parallel plans, read as the package's ``ShardingPlan``.

A transformers model carries its plans: ``model.tp_plan`` and ``model.ep_plan`` map
module or parameter names, layer numbers written ``*`` (``model.layers.*.mlp.up_proj``),
to style names (``"colwise"``, ``"packed_colwise"``, ``"grouped_gemm"``, ...). When
``from_pretrained(..., distributed_config=...)`` shards a model it resolves them the way
``plan_from_hf`` does:

- expert parallelism on, its rules win: every tensor-parallel rule on a module that has
  an expert-parallel rule, or on anything under it, is dropped; 5.25 then applies the
  expert-parallel rules only if one of them reaches a module of the model with
  ``ep_dispatch_experts`` (a model with no experts module, like gemma4's default dense
  config, gets none of its ``ep_plan``: those modules stay plain tensors);
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

The styles are those of the transformers imported (none imported: the newest known),
release by release as ``STYLES_BY_RELEASE`` lists them; a style two releases register
does the same to a parameter in both. 5.25 registers ``unit_colwise`` and
``unit_rowwise`` and drops ``moe_identity_expert``, and its tensor parallelism can no
longer apply an expert-parallel style (``grouped_gemm``, ``ep_dispatch_experts``) from a
``tp_plan`` (no release hooks ``ep_dispatch_experts`` on a module from one): such rules
are problems of the ``PlanError``. A unit style puts a weight on a mesh of its own, the
tp ranks in ``gcd(heads, tp size)`` groups of whole attention heads, replicated within a
group: no placement on the tp axis says that (2 heads over 4 ranks: ranks 0 and 1 hold
head 0, ranks 2 and 3 head 1). When ``tp_size=`` gives the tp size and it divides the
weight's head count (from the model's config), each rank holds the rows the plain style
(``colwise``, ``rowwise``) gives it, and the weight is read so; otherwise it is a problem
too, whose message says what to do. transformers builds that mesh apart from the run's
meshes, so FSDP cannot compose with it: with ``fsdp=True`` every weight a unit style places
is a problem.
A transformers newer than ``NEWEST_KNOWN`` is refused: its styles might mean something
else.

The package never imports transformers: everything is read off the model object
(``tp_plan``, ``ep_plan``, ``all_tied_weights_keys``, ``config``, its modules and
parameters) and off ``transformers.__version__`` when the model brought transformers in.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

import attrs
from torch import nn

from layout_algebra._args import mapping_items, plain_str
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.mesh import MAX_MESH_SIZE, is_mesh_size
from layout_algebra.placements import (
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)
from layout_algebra.plan import ShardingPlan, param_fqn
from layout_algebra.torch_bridge._checks import check_module, read_attr, reading
from layout_algebra.torch_bridge._plans import Problems, shard_dim, sharding_plan
from layout_algebra.torch_bridge._walk import (
    named_modules,
    named_parameters,
    own_parameters,
    state_dict_fqn,
)

__all__ = ["KNOWN_STYLES", "STYLES_BY_RELEASE", "plan_from_hf"]


@attrs.frozen
class _OwnMesh:
    """A unit style's weight: on a mesh transformers builds for it from the head count.

    ``instead`` is the style that gives every rank the same rows when the tp size divides
    the head count (the unit mesh is then the tp ranks, one group each).
    """

    instead: str


_Rule: TypeAlias = Callable[[str, int], Placement | int | _OwnMesh | None]
"""A style's placement for a parameter, from its name and rank: a placement, or a
``Shard`` dim still to be counted from 0 (``-1`` is the last), or ``None`` (plain), or
``_OwnMesh`` (no placement on the plan's axis says it)."""

_R: Final = Replicate()


def _colwise(_: str, ndim: int) -> int:
    return ndim - 2  # a Linear's output rows; dim 1 of a 3-D expert weight; a bias's dim 0


def _rowwise(leaf: str, _: int) -> Placement | int:
    return _R if leaf == "bias" else -1  # added after the reduction, so whole


def _packed_colwise(_: str, ndim: int) -> Placement | int:
    # gate and up stacked on the output dim: each rank takes its part of both halves (a
    # 0-d parameter has no such dim: dim -2, which it lacks, is a problem naming it)
    if ndim < 2:
        return 0 if ndim == 1 else -2
    return StridedShard(ndim - 2, split_factor=2)


def _packed_rowwise(_: str, ndim: int) -> Placement | int:
    if ndim < 2:  # a bias whole; a 0-d parameter lacks the dim -1 transformers splits
        return _R if ndim == 1 else -1
    return StridedShard(ndim - 1, split_factor=2)


def _unit_colwise(_: str, __: int) -> _OwnMesh:
    return _OwnMesh("colwise")  # rows by head, bias too: split over the groups


def _unit_rowwise(leaf: str, _: int) -> Placement | _OwnMesh:
    return _R if leaf == "bias" else _OwnMesh("rowwise")  # the bias whole on every rank


def _shard(dim: int) -> _Rule:
    def rule(_: str, __: int) -> int:
        return dim

    return rule


def _plain(_: str, __: int) -> None:
    return None


@attrs.frozen(kw_only=True)
class _Release:
    """What the transformers releases up to one (major, minor) do with their styles."""

    name: str
    """The newest release covered, as messages name it (``"5.24"``)."""
    rules: Mapping[str, _Rule]
    """What each style registered does to a parameter it names."""
    replicates_module: frozenset[str]
    """Styles that, on a module, make each of its own parameters a replicated DTensor."""
    refused_in_ep: frozenset[str]
    """Styles transformers refuses in an ``ep_plan``."""
    tp_cannot_apply: frozenset[str]
    """Styles whose rule in a ``tp_plan`` transformers fails to apply, wherever it lands."""
    tp_cannot_hook: frozenset[str]
    """Styles whose rule on a module in a ``tp_plan`` transformers fails to apply (the
    forward hook needs more than the tp mesh)."""
    ep_styles: tuple[str, str]
    """What shards experts instead: the experts module's style, then their weights'."""
    gone: Mapping[str, str] = attrs.field(factory=dict)
    """Styles an earlier release registered and this one does not: what to do instead."""
    ep_only_with_dispatch: bool = False
    """Whether expert parallelism applies the ``ep_plan`` only when a rule of it, expanded
    over the model, is ``ep_dispatch_experts`` (5.25's ``maybe_distribute_model``)."""


_SHARED_RULES: Final[Mapping[str, _Rule]] = {
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
    "local_params": _plain,
    "replicate": _plain,
    "ep_dispatch_experts": _plain,
}
"""What each style every known release registers does to a parameter it names."""

_REPLICATES_MODULE: Final = frozenset({"sequence_parallel"})
_REFUSED_IN_EP: Final = frozenset({"ep_router", "moe_tp_experts"})
_EP_STYLES: Final = ("ep_dispatch_experts", "grouped_gemm")
_NEEDS_TWO_MESHES: Final = frozenset({"ep_dispatch_experts"})  # its hook: the tp and ep meshes

_RELEASES: Final[Mapping[tuple[int, int], _Release]] = {
    (5, 24): _Release(
        name="5.24",
        rules={**_SHARED_RULES, "moe_identity_expert": _plain},
        replicates_module=_REPLICATES_MODULE,
        refused_in_ep=_REFUSED_IN_EP,
        tp_cannot_apply=frozenset(),
        tp_cannot_hook=_NEEDS_TWO_MESHES,
        ep_styles=_EP_STYLES,
    ),
    (5, 25): _Release(
        name="5.25",
        rules={**_SHARED_RULES, "unit_colwise": _unit_colwise, "unit_rowwise": _unit_rowwise},
        replicates_module=_REPLICATES_MODULE,
        refused_in_ep=_REFUSED_IN_EP,
        # its tensor parallelism hands every style the model's config and meshes, which
        # the expert-parallel styles' methods do not take
        tp_cannot_apply=frozenset(_EP_STYLES),
        tp_cannot_hook=_NEEDS_TWO_MESHES,
        ep_styles=_EP_STYLES,
        ep_only_with_dispatch=True,
        gone={
            "moe_identity_expert": (
                "transformers 5.25 removed it, and its MoE plans shard experts by expert: "
                f"{_EP_STYLES[0]!r} and {_EP_STYLES[1]!r} in the ep_plan"
            )
        },
    ),
}
"""Each known range of releases, keyed by its newest (major, minor), oldest first: (5, 24)
covers 5.24 and earlier, (5, 25) covers 5.25."""

NEWEST_KNOWN: Final[tuple[int, int]] = max(_RELEASES)
"""The newest transformers (major, minor) whose parallel styles ``plan_from_hf`` knows;
a newer one is refused (``LayoutError``)."""

STYLES_BY_RELEASE: Final[Mapping[tuple[int, int], frozenset[str]]] = MappingProxyType(
    {release: frozenset(known.rules) for release, known in _RELEASES.items()}
)
"""The style names ``plan_from_hf`` reads, by transformers release: each key the newest
(major, minor) its set covers, ``(5, 24)`` for 5.24 and earlier, ``(5, 25)`` for 5.25.
A plan read under an installed transformers may use only that release's styles."""

KNOWN_STYLES: Final[frozenset[str]] = STYLES_BY_RELEASE[NEWEST_KNOWN]
"""The style names the newest known transformers registers (``NEWEST_KNOWN``), which
``plan_from_hf`` reads when that release, or no transformers, is imported;
``STYLES_BY_RELEASE`` has each release's."""


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


def _rule_of(name: str, plan: Mapping[str, str], *, param: bool) -> tuple[str, str] | None:
    """The rule ``plan`` gives ``name`` (its key and style): its own, else (a parameter)
    its module's."""
    generic = _wildcards(name)
    found = plan.get(generic)
    if found is not None:
        return generic, found
    if param and "." in generic:
        module = generic.rpartition(".")[0]
        found = plan.get(module)
        if found is not None:
            return module, found
    return None


_MISSING: Final = object()
"""What ``_attr`` gives for an attribute the object does not have, when asked to."""


def _attr(obj: object, name: str, shown: str, default: object = None) -> object:
    """``obj.name`` (``default`` when it has none), read once (``read_attr``).

    Raises:
        LayoutError: reading it raised: naming ``shown`` (``model.tp_plan``), the exception
            its ``__cause__``.
    """
    return read_attr(obj, name, shown, remedy=_remedy(shown), caller=_CALLER, default=default)


_CALLER: Final = "plan_from_hf"


def _remedy(shown: str) -> str:
    return f"the model's plan cannot be read: fix {shown}, or write the ShardingPlan"


def _read_plan(raw: object, attr: str, release: _Release, problems: Problems) -> dict[str, str]:
    """The rules of the model's plan ``raw`` (its ``attr``) this release registers."""
    if raw is None or raw is _MISSING:
        return {}
    if not isinstance(raw, Mapping):
        problems.add(f"model.{attr} must map names to style names, got {quote(raw)}")
        return {}
    plan: dict[str, str] = {}
    example = "{'layers.*.self_attn.q_proj': 'colwise'}"
    for raw_key, raw_style in mapping_items(raw, f"model.{attr}", example):
        if not isinstance(raw_key, str) or not isinstance(raw_style, str):
            msg = (
                f"model.{attr}: {quote(raw_key)}: {quote(raw_style)} is not a name and a style name"
            )
            problems.add(msg)
            continue
        key, style = plain_str(raw_key), plain_str(raw_style)  # their own __eq__ never runs
        where = f"model.{attr}[{clip(key)!r}]"
        if attr == "ep_plan" and style in release.refused_in_ep:
            experts, weights = release.ep_styles
            msg = (
                f"{where}: style {clip(style)!r} does not belong in an ep_plan (transformers "
                f"{release.name} refuses it); shard the experts by expert: {experts!r} on the "
                f"experts module and {weights!r} on their weights"
            )
            problems.add(msg, fqn=key)
            continue
        if style not in release.rules:
            instead = release.gone.get(style)
            remedy = f"{instead}; fix the rule" if instead is not None else "fix the style name"
            msg = (
                f"{where}: style {clip(style)!r} is not one transformers {release.name} "
                f"registers (known: {', '.join(sorted(release.rules))}); {remedy}, or plan "
                "these parameters by hand"
            )
            problems.add(msg, fqn=key)
            continue
        plan[key] = style
    return plan


_Expanded: TypeAlias = dict[str, tuple[str, str]]
"""One rule per module or parameter FQN: the plan's key that reaches it, and its style."""


def _expand(model: nn.Module, plan: Mapping[str, str]) -> _Expanded:
    """One rule per module and parameter of ``model``, parameters before their module."""
    out: _Expanded = {}
    if not plan:
        return out
    with reading("model.named_modules()", remedy=_remedy("its named_modules"), caller=_CALLER):
        modules = list(model.named_modules())
    for raw, module in modules:
        path = state_dict_fqn(raw)  # as every reader of the bridge names it
        for leaf, _ in own_parameters(module, path, remove_duplicate=True):
            fqn = param_fqn(path, leaf)
            rule = _rule_of(fqn, plan, param=True)
            if rule is not None:
                out[fqn] = rule
        rule = _rule_of(path, plan, param=False)
        if rule is not None:
            out[path] = rule
    return out


def _head_count(model: nn.Module, path: str, module: nn.Module, *, rows: bool) -> int | None:
    """The attention heads a unit style counts in ``module``'s weight (the module at
    ``path``), when the model's config tells: its rows (``rows``) or columns over the
    config's head dim."""
    config = _attr(model, "config", "model.config")
    text = _attr(config, "get_text_config", "model.config.get_text_config")
    if callable(text):
        shown = "model.config.get_text_config()"
        with reading(shown, remedy=_remedy(shown), caller=_CALLER):
            config = text()
    head_dim = _attr(config, "head_dim", "the text config's head_dim")
    if not head_dim:
        hidden = _attr(config, "hidden_size", "the text config's hidden_size")
        heads = _attr(config, "num_attention_heads", "the text config's num_attention_heads")
        if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
            return None
        head_dim = hidden // heads
    weight = dict(own_parameters(module, path)).get("weight")
    if not isinstance(head_dim, int) or head_dim <= 0 or weight is None or weight.ndim == 0:
        return None
    return int(weight.shape[0 if rows else -1]) // head_dim


class _Placer:
    """Each parameter's placement as transformers' styles give it, rule by rule."""

    def __init__(
        self,
        model: nn.Module,
        release: _Release,
        problems: Problems,
        tp_size: int | None,
        *,
        fsdp: bool = False,
    ) -> None:
        self.model = model
        self.release = release
        self.problems = problems
        self.tp_size = tp_size
        self.fsdp = fsdp
        self.params: dict[str, nn.Parameter] = dict(named_parameters(model))
        self.modules: dict[str, nn.Module] = dict(named_modules(model))
        self.placed: dict[str, tuple[str, Placement, str]] = {}  # fqn -> (axis, placement, key)

    def apply(self, plan: _Expanded, axis: AxisName, which: str) -> None:
        unhooked: set[str] = set()
        for name, (key, style) in plan.items():
            param = self.params.get(name)
            if param is not None:
                self.param(name, param, key=key, style=style, axis=axis, which=which)
                continue
            module = self.modules.get(name)
            if which == "tp_plan" and style in self.release.tp_cannot_hook:
                if module is not None and key not in unhooked:
                    unhooked.add(key)
                    why = f"on a module ({quote(name)}) it hooks the forward with the ep mesh too"
                    self.problems.add(_not_in_tp(key, style, self.release, why), fqn=key)
                continue
            if module is not None and style in self.release.replicates_module:
                for leaf, _ in own_parameters(module, name, remove_duplicate=True):
                    self.place(param_fqn(name, leaf), _R, axis, f"{which}[{quote(name)}] {style!r}")

    def param(
        self, fqn: str, param: nn.Parameter, *, key: str, style: str, axis: AxisName, which: str
    ) -> None:
        leaf = fqn.rpartition(".")[2]
        rule = self.release.rules[style](leaf, param.ndim)
        if rule is None:
            return
        placement: Placement
        if isinstance(rule, _OwnMesh):
            if self.fsdp:
                self.problems.add(_unit_mesh_with_fsdp(fqn, key, style, which), fqn=fqn)
                return
            heads = self.heads(fqn, rule)
            if heads is None or self.tp_size is None or heads % self.tp_size:
                self.own_mesh(fqn, rule, heads, key=key, style=style, axis=axis, which=which)
                return
            # whole heads per tp rank, one group each: the rows the plain style gives
            rule = self.release.rules[rule.instead](leaf, param.ndim)
            if rule is None or isinstance(rule, _OwnMesh):
                return  # not so for any known release: the plain styles place every weight
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

    def heads(self, fqn: str, rule: _OwnMesh) -> int | None:
        """The attention heads a unit style counts in ``fqn``'s weight, if the config says."""
        path = fqn.rpartition(".")[0]
        module = self.modules.get(path)
        if module is None:
            return None
        # unit_colwise counts heads in the rows, unit_rowwise in the columns
        return _head_count(self.model, path, module, rows=rule.instead == "colwise")

    def own_mesh(
        self,
        fqn: str,
        rule: _OwnMesh,
        heads: int | None,
        *,
        key: str,
        style: str,
        axis: AxisName,
        which: str,
    ) -> None:
        """A problem for a weight a unit style puts on a mesh of its own that no placement
        on ``axis`` says (its heads unknown, the tp size unknown, or not dividing them)."""
        instead, size = rule.instead, self.tp_size
        count = f"its {heads} heads" if heads is not None else "its heads"
        if heads is not None and size is not None:
            remedy = (
                f"give {axis.name} a size that divides {heads} (it is {size}), or write the "
                "ShardingPlan"
            )
        elif heads is not None:
            remedy = (
                f"pass tp_size=... (the {axis.name} size): when it divides {heads}, each rank "
                f"holds the rows {instead!r} gives it, and the weight is read so"
            )
        else:
            remedy = (
                f"when the {axis.name} size divides the head count each rank holds the rows "
                f"{instead!r} gives it, so read the plan with {which}[{clip(key)!r}] set to "
                f"{instead!r}, or write the ShardingPlan"
            )
        msg = (
            f"{fqn}: style {style!r} ({which}[{clip(key)!r}]) puts it on a mesh of its own "
            f"that transformers {self.release.name} builds from {count}: the ranks of "
            f"{axis.name!r} in gcd(heads, {axis.name} size) groups of whole heads, every rank "
            f"of a group holding the same ones, which no placement on {axis.name!r} says; "
            f"{remedy}"
        )
        self.problems.add(msg, fqn=fqn)

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


def _unit_mesh_with_fsdp(fqn: str, key: str, style: str, which: str) -> str:
    """The problem of a unit-styled weight in a run with FSDP."""
    return (
        f"{fqn}: style {style!r} ({which}[{clip(key)!r}]) puts it on a (tp, unit_replicate) "
        "mesh transformers builds apart from the run's meshes, which neither torch's "
        "fully_shard nor transformers' own FSDP can compose with it (\"Cannot concatenate "
        'DeviceMeshes derived from different device meshs"); run it without FSDP (fsdp=False), '
        f"or give the rule the style {style[5:]!r} (DistributedConfig(tp_plan={{...}}))"
    )


def _not_in_tp(key: str, style: str, release: _Release, why: str) -> str:
    """The message for a ``tp_plan`` rule transformers fails to apply, and ``why``."""
    return (
        f"model.tp_plan[{clip(key)!r}]: transformers {release.name} cannot apply style "
        f"{style!r} from a tp_plan ({why}); put the rule in the ep_plan, or drop it"
    )


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


def _check_tp_size(tp_size: object) -> None:
    """``tp_size`` is ``None`` or a mesh size.

    Raises:
        LayoutError: naming ``tp_size`` and what it must be.
    """
    if tp_size is not None and not is_mesh_size(tp_size):
        msg = (
            f"plan_from_hf(tp_size=...): must be the tensor-parallel mesh's size, an int "
            f"from 1 to {MAX_MESH_SIZE:,}, or None; got {quote(tp_size)}"
        )
        raise LayoutError(msg)


_VERSION: Final = re.compile(
    r"""
    \s* v?
    (?: (?P<epoch> [0-9]+ ) ! )?
    (?P<major> [0-9]+ ) (?: \. (?P<minor> [0-9]+ ) )? (?: \. [0-9]+ )*
    (?: [-_.]? (?: alpha | a | beta | b | preview | pre | c | rc ) [-_.]? [0-9]* )?
    (?: - [0-9]+ | [-_.]? (?: post | rev | r ) [-_.]? [0-9]* )?
    (?: [-_.]? dev [-_.]? [0-9]* )?
    (?: \+ [a-z0-9]+ (?: [-_.] [a-z0-9]+ )* )?
    \s*
    """,
    re.VERBOSE | re.IGNORECASE | re.ASCII,
)
"""A version as PEP 440 spells it (``5.25.0``, ``v5.30.0``, ``5.26rc1``, ``6.dev``,
``1!2.0+local``): only its epoch, major and minor are read."""


def _release_of(version: str) -> tuple[int, int, int] | None:
    """``(epoch, major, minor)`` of a PEP 440 version, or ``None`` when it is not one.

    A pre-, post- or dev release counts as the release it belongs to: ``5.26rc1`` and
    ``5.26.0.dev0`` are 5.26 (newer than 5.25), ``6.dev`` is 6.0, a missing minor is 0.

    >>> _release_of("v5.30.0"), _release_of("5.26rc1"), _release_of("6.dev")
    ((0, 5, 30), (0, 5, 26), (0, 6, 0))
    >>> _release_of("unknown") is None
    True
    """
    found = _VERSION.fullmatch(version)
    if found is None:
        return None
    epoch, major, minor = found.group("epoch", "major", "minor")
    return _number(epoch or "0"), _number(major), _number(minor or "0")


def _number(digits: str) -> int:
    """ASCII ``digits`` as an int; past 18 digits (no release is numbered so) 10**18."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


def _installed_release(transformers: object) -> _Release:
    """The styles of the transformers imported: the known range its version falls in.

    No transformers imported, or a version that is not a PEP 440 one (a model that only
    looks like a transformers one): the newest known. A transformers newer than
    ``NEWEST_KNOWN``, its pre-releases and dev builds included, is refused: its plans would
    be read by older styles' meaning, silently wrong.
    """
    newest = _RELEASES[NEWEST_KNOWN]
    version = _attr(transformers, "__version__", "transformers.__version__")
    if not isinstance(version, str):
        return newest
    found = _release_of(version)
    if found is None:
        return newest
    epoch, major, minor = found
    release = (major, minor)
    if epoch > 0 or release > NEWEST_KNOWN:
        msg = (
            f"plan_from_hf: transformers {clip(version)} is newer than {newest.name}, the "
            "newest whose tensor-parallel styles this version of layout_algebra knows (a "
            "newer release may rename them or change what they do to a parameter); install "
            f"transformers<={newest.name}.* or write the ShardingPlan"
        )
        raise LayoutError(msg)
    return next(known for last, known in _RELEASES.items() if release <= last)


def _tie_again(root: nn.Module, placer: _Placer, problems: Problems) -> list[tuple[str, str]]:
    """The model's tied pairs, ``(source, target)``: after loading, each target is its
    source's parameter again, whatever its own rule placed (its placement is dropped)."""
    tied: list[tuple[str, str]] = []
    raw_tied = _attr(root, "all_tied_weights_keys", "model.all_tied_weights_keys")
    if not isinstance(raw_tied, Mapping):  # None or any other false value: no ties
        if raw_tied:
            msg = f"model.all_tied_weights_keys must map names to names, got {quote(raw_tied)}"
            problems.add(msg)
        return tied
    example = "{'lm_head.weight': 'model.embed_tokens.weight'}"
    for target, source in mapping_items(raw_tied, "model.all_tied_weights_keys", example):
        if type(target) is not str or type(source) is not str:
            msg = (
                f"model.all_tied_weights_keys must map parameter names to parameter names, "
                f"but maps {quote(target)} to {quote(source)}; fix the model's tied weights"
            )
            problems.add(msg, fqn=target if type(target) is str else None)
            continue
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
    return tied


def plan_from_hf(
    model: nn.Module,
    *,
    tp_axis: AxisLike | None = "tp",
    ep_axis: AxisLike | None = "ep",
    mesh_axes: Iterable[AxisLike],
    tp_size: int | None = None,
    fsdp: bool = False,
) -> ShardingPlan:
    """The ``ShardingPlan`` giving each parameter what transformers' own parallelism gives it.

    The model's ``tp_plan`` is read when ``tp_axis`` is one of ``mesh_axes``, its
    ``ep_plan`` when ``ep_axis`` is (pass ``None`` to read no plan for an axis, as for a
    transformers mesh whose ``ep`` has size 1). The styles are those of the transformers
    imported (``STYLES_BY_RELEASE``; with none imported, the newest known). The result is
    what ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=...,
    ep_size=...))`` makes of the model: tensor-parallel placements on ``tp_axis``; expert
    weights ``S(0)`` on ``ep_axis`` in ``expert_parallel`` modules (``build_table`` routes
    them to the expert mesh when ``ep_axis`` is ``"ep"``); tied targets tied to their
    source (``tied_pairs``); parameters no rule shards left out (plain tensors:
    ``complete_default(..., plain=True)`` completes them). Rules that name nothing in the
    model are skipped, as transformers skips them (it warns).

    Args:
        model: a transformers model (``PreTrainedModel``), e.g. built from its config on
            the meta device.
        tp_axis: the axis of the tensor-parallel mesh, or ``None``.
        ep_axis: the axis of the expert-parallel mesh, or ``None``.
        mesh_axes: the run's axis names, for the plan's ``mesh_axes``.
        tp_size: the size of the tensor-parallel mesh, when known. Only 5.25's unit
            styles need it: a weight of whole heads is read as its plain style
            (``colwise``/``rowwise``) when the tp size divides its head count, and is a
            problem otherwise (no placement on ``tp_axis`` says what each rank holds).
        fsdp: whether the run shards the model with FSDP after tensor parallelism
            (``DistributedConfig(fsdp_size=...)`` above 1, or ``fully_shard``). A weight
            a unit style places is then a problem whatever ``tp_size``: transformers puts
            it on a ``(tp, unit_replicate)`` mesh of its own, which FSDP cannot compose.

    Returns:
        One ``{axis: placement}`` per parameter a rule places, in the model's order.

    Raises:
        LayoutError: ``model`` is not an ``nn.Module``, or has neither ``tp_plan`` nor
            ``ep_plan``, or the transformers imported is newer than ``NEWEST_KNOWN``
            (its styles would be read with the wrong meaning; a pre-release or dev
            build of a newer release too), or ``tp_size`` is not ``None`` or an int from
            1 to ``MAX_MESH_SIZE``, or reading one of the model's attributes
            (``tp_plan``, ``ep_plan``, ``all_tied_weights_keys``, ``config`` and its
            ``get_text_config()``, its walk of its modules and parameters) raised, an
            ``AttributeError`` from a property included: naming it, the model's exception
            as ``__cause__``.
        BindError: a module of the model holds one of its ancestors (a cycle of
            submodules), naming the path that closes it.
        PlanError: every problem at once, each naming the rule or parameter and the
            style: a style the transformers imported does not register, a style it
            refuses in an ``ep_plan`` or cannot apply from a ``tp_plan``, an axis read
            whose plan is empty, a shard dim the parameter lacks, a weight a unit style
            (5.25's ``unit_colwise`` and ``unit_rowwise``) puts on a mesh of its own (no
            ``tp_size``, or one that does not divide its heads), a parameter two rules
            place, a tied name that is not a parameter, a weight a unit style places
            in a run with ``fsdp``.
    """
    root = check_module(model, "plan_from_hf(model=...)")
    release = _installed_release(sys.modules.get("transformers"))
    raw_tp = _attr(root, "tp_plan", "model.tp_plan", _MISSING)
    raw_ep = _attr(root, "ep_plan", "model.ep_plan", _MISSING)
    if raw_tp is _MISSING and raw_ep is _MISSING:
        msg = (
            f"plan_from_hf(model=...): a {type(root).__qualname__} has neither tp_plan nor "
            "ep_plan, so it is not a transformers model; use plan_from_parallelize for a "
            "torch plan, or write the ShardingPlan"
        )
        raise LayoutError(msg)
    axes = as_axes(mesh_axes, "plan_from_hf(mesh_axes=...)")
    _check_tp_size(tp_size)
    tp = _active(tp_axis, axes, "tp_axis")
    ep = _active(ep_axis, axes, "ep_axis")
    problems = Problems("plan_from_hf")
    tp_rules = _read_plan(raw_tp, "tp_plan", release, problems) if tp is not None else {}
    ep_rules = _read_plan(raw_ep, "ep_plan", release, problems) if ep is not None else {}
    for axis, rules, which in ((tp, tp_rules, "tp_plan"), (ep, ep_rules, "ep_plan")):
        if axis is not None and not rules:
            arg = "tp_axis" if which == "tp_plan" else "ep_axis"
            unless = ", unless DistributedConfig(tp_plan={}) asks for none (5.25)"
            msg = (
                f"{arg}={axis.name!r} is one of mesh_axes, but the model's {which} is empty, "
                f"so it shards nothing over {axis.name!r} (transformers refuses that size > 1 "
                f"without a plan{unless if which == 'tp_plan' else ''}); pass {arg}=None when "
                "this run has no such parallelism, or set the model's plan"
            )
            problems.add(msg)
    # Expert parallelism's rules win over tensor parallelism's on their modules.
    tp_rules = {
        key: style
        for key, style in tp_rules.items()
        if not any(key == e or key.startswith(f"{e}.") for e in ep_rules)
    }
    for key, style in list(tp_rules.items()):
        if style in release.tp_cannot_apply:
            why = (
                "an expert-parallel style, it takes none of the model's config and meshes "
                "that tensor parallelism hands every style"
            )
            problems.add(_not_in_tp(key, style, release, why), fqn=key)
            del tp_rules[key]
    raw_fsdp: object = fsdp
    if not isinstance(raw_fsdp, bool):
        msg = f"plan_from_hf(fsdp=...): must be True or False, got {quote(raw_fsdp)}"
        raise LayoutError(msg)
    placer = _Placer(root, release, problems, tp_size, fsdp=fsdp)
    if tp is not None:
        placer.apply(_expand(root, tp_rules), tp, "tp_plan")
    if ep is not None:
        ep_expanded = _expand(root, ep_rules)
        if release.ep_only_with_dispatch and all(
            style != _EP_STYLES[0] for _, style in ep_expanded.values()
        ):
            # no experts module to dispatch to: transformers applies no ep rule at all,
            # yet it has dropped the tp rules of the modules the ep plan names
            ep_expanded = {}
        placer.apply(ep_expanded, ep, "ep_plan")

    tied = _tie_again(root, placer, problems)
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
