"""torch's ``parallelize_module`` plans, read as the package's ``ShardingPlan``.

``parallelize_module(module, tp_mesh, {"layers.*.attention.wq": ColwiseParallel(), ...})``
walks its plan key by key: each key is split at its dots, each token matched with
``fnmatch`` against the names of the current module's children, and the style applied to
every module the whole key reaches, in the plan's order. ``plan_from_parallelize`` walks
the same way without touching the model and records what each style does to each
parameter:

- ``ColwiseParallel``: every parameter of an ``nn.Linear`` ``S(0)`` (weight and bias),
  of an ``nn.Embedding`` ``S(1)``;
- ``RowwiseParallel``: an ``nn.Linear``'s weight ``S(1)`` and bias ``R``, an
  ``nn.Embedding``'s parameters ``S(0)``;
- ``SequenceParallel``: the module's parameters ``R`` (replicated DTensors);
- the three ``PrepareModule*`` styles install hooks only: parameters untouched.

Parameters of a module that one of the first three styles distributes but that the style
does not name (an extra parameter of a ``Linear`` subclass under ``RowwiseParallel``)
become ``R``, as torch's ``distribute_module`` replicates them. Input and output layouts
and ``use_local_output`` change activations, never parameters. Parameters no style
reaches stay plain tensors and get no entry (``complete_default(..., plain=True)``
completes them).

torch replaces a parameter by registering a new one on its module, so a parameter shared
by two modules (an embedding tied to the LM head) is no longer shared once either side
is distributed: the plan's ``tied_pairs`` hold only the FQNs that still name one
parameter afterwards.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Final, Literal, TypeAlias

from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from layout_algebra._args import mapping_items, plain_str
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, as_axes
from layout_algebra.errors import LayoutError
from layout_algebra.placements import Placement, Replicate, Shard, format_placement
from layout_algebra.plan import ShardingPlan, param_fqn
from layout_algebra.torch_bridge._checks import check_module
from layout_algebra.torch_bridge._plans import Problems, axis_in, sharding_plan
from layout_algebra.torch_bridge._walk import (
    children,
    named_modules,
    named_parameters,
    own_parameters,
)

__all__ = ["ParallelizePlan", "plan_from_parallelize"]

ParallelizePlan: TypeAlias = ParallelStyle | Mapping[str, "ParallelizePlan"]
"""What ``parallelize_module`` takes: one style for the module, or styles by key."""

_MAX_DEPTH: Final = 256
"""How deep a plan may lead, nested dicts and dotted key tokens counted together: far
beyond any model's depth, well within Python's recursion limit."""

_Kind: TypeAlias = Literal["colwise", "rowwise", "sequence", "prepare"]

_READABLE: Final[tuple[tuple[type[ParallelStyle], _Kind, tuple[str, ...]], ...]] = (
    (ColwiseParallel, "colwise", ("_apply", "_partition_linear_fn", "_partition_embedding_fn")),
    (RowwiseParallel, "rowwise", ("_apply", "_partition_linear_fn", "_partition_embedding_fn")),
    (SequenceParallel, "sequence", ("_apply", "_replicate_module_fn")),
    (PrepareModuleInputOutput, "prepare", ("_apply",)),
    (PrepareModuleInput, "prepare", ("_apply",)),
    (PrepareModuleOutput, "prepare", ("_apply",)),
)
"""The styles read, and the methods through which a style touches parameters: a subclass
that overrides one of them does something of its own, which is not read."""

_STYLE_NAMES: Final = (
    "ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, "
    "PrepareModuleOutput or PrepareModuleInputOutput"
)
_S0: Final = Shard(0)
_S1: Final = Shard(1)
_R: Final = Replicate()


def _where(path: str) -> str:
    return f"module {quote(path)}" if path else "the root module"


def _style_kind(style: ParallelStyle) -> tuple[_Kind | None, str]:
    """The kind of a style this module reads, or ``None`` and why it cannot be read."""
    for base, kind, methods in _READABLE:
        if isinstance(style, base):
            own = [m for m in methods if getattr(type(style), m) is not getattr(base, m)]
            if own:
                why = (
                    f"a subclass of {base.__name__} that overrides {', '.join(own)}, so what it "
                    "does to parameters is its own"
                )
                return None, why
            return kind, ""
    return None, f"a {type(style).__qualname__}, which is not one of torch's styles read here"


class _Walk:
    """One walk of a plan over a module, as ``parallelize_module`` walks it."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        # (module, parameter name) -> its placement: the parameter slots a style
        # re-registered (modules hash by identity, as in torch's own walks)
        self.written: dict[tuple[nn.Module, str], Placement] = {}
        self.distributed: dict[nn.Module, tuple[str, str]] = {}  # module -> (key, path)
        self.applied = 0

    def plan(self, module: nn.Module, path: str, plan: object, key: str, *, depth: int = 0) -> None:
        """Apply ``plan`` (a style or a dict of them) to ``module``; ``key`` led here,
        through ``depth`` nested dicts and dotted tokens."""
        if isinstance(plan, ParallelStyle):
            self.applied += 1
            self.style(module, path, plan, key)
            return
        if not isinstance(plan, Mapping):
            self.applied += 1  # it reached a module: the problem is the value
            msg = (
                f"plan key {quote(key)}: {quote(plan)} is neither a ParallelStyle nor a dict of "
                "them; give a style such as ColwiseParallel() or a dict {key: style}"
            )
            self.problems.add(msg, fqn=path)
            return
        arg = f"plan key {quote(key)}" if key else "plan_from_parallelize(plan=...)"
        example = "{'layers.*.attention.wq': ColwiseParallel()}"
        for raw, style in mapping_items(plan, arg, example):
            if not isinstance(raw, str):
                msg = (
                    f"plan key {quote(raw)} is not a string; keys are module FQNs such as "
                    "'layers.*.attention.wq'"
                )
                self.problems.add(msg, fqn=path)
                continue
            sub = plain_str(raw)  # a str subclass's own __eq__ never runs
            shown = f"{key} -> {sub}" if key else sub
            before = self.applied
            self.reach(module, path, sub, style, shown, depth=depth + 1)
            if self.applied == before and not key:
                msg = (
                    f"plan key {quote(sub)} reaches no module of the model (torch's "
                    "parallelize_module would warn and skip it); fix the key, or remove it"
                )
                self.problems.add(msg, fqn=sub)

    def reach(
        self, module: nn.Module, path: str, sub: str, style: object, key: str, *, depth: int
    ) -> None:
        """Follow ``sub`` down from ``module`` token by token, as torch does (``depth``
        deep in the plan: every nested dict and token passes here).

        Raises:
            LayoutError: deeper than ``_MAX_DEPTH``.
        """
        if depth > _MAX_DEPTH:
            msg = (
                f"plan_from_parallelize(plan=...): plan key {clip(key)!r} leads deeper than "
                f"{_MAX_DEPTH} levels (nested dicts and dotted tokens together), deeper than "
                "any model: a plan that holds itself? give each module its style at most "
                f"{_MAX_DEPTH} levels down"
            )
            raise LayoutError(msg, fqn=path)
        if sub == "":
            self.plan(module, path, style, key, depth=depth)  # the module itself
            return
        token, dot, rest = sub.partition(".")
        for name, child in children(module, path):
            if fnmatch.fnmatch(name, token):
                child_path = param_fqn(path, name)
                if dot:
                    self.reach(child, child_path, rest, style, key, depth=depth + 1)
                else:
                    self.plan(child, child_path, style, key, depth=depth + 1)

    def style(self, module: nn.Module, path: str, style: ParallelStyle, key: str) -> None:
        """Record what ``style`` does to the parameters of ``module``."""
        kind, why = _style_kind(style)
        where = _where(path)
        if kind == "prepare":
            return
        if kind is None:
            msg = (
                f"{where} (plan key {quote(key)}): {quote(style)} is {why}; give torch's "
                f"{_STYLE_NAMES}, or write this module's ShardingPlan entries by hand, or "
                "let the style say it: parallelize_module on the model built on the meta "
                "device over a mesh of the fake process group, then table_from_module"
            )
            self.problems.add(msg, fqn=path)
            return
        earlier = self.distributed.get(module)
        if earlier is not None:
            msg = (
                f"{where} (plan key {quote(key)}): {type(style).__name__} distributes a module "
                f"that plan key {quote(earlier[0])} already distributed, which torch's "
                "distribute_module refuses; give each module one of ColwiseParallel, "
                "RowwiseParallel and SequenceParallel"
            )
            self.problems.add(msg, fqn=path)
            return
        self.distributed[module] = (key, path)
        named = self.placements(module, path, style, kind, key)
        if named is None:
            return
        for name, param in own_parameters(module, path, remove_duplicate=True):
            p = named.get(name, _R)  # distribute_module replicates what the style leaves
            fqn = param_fqn(path, name)
            if isinstance(p, Shard) and p.dim >= param.ndim:
                shown = format_placement(p)
                msg = (
                    f"{fqn}: {type(style).__name__} shards it {shown}, but it has "
                    f"{param.ndim} dim(s) (torch's distribute_tensor fails); plan another "
                    "style for this module"
                )
                self.problems.add(msg, fqn=fqn, placement=shown)
                continue
            self.written[module, name] = p

    def placements(
        self, module: nn.Module, path: str, style: ParallelStyle, kind: _Kind, key: str
    ) -> dict[str, Placement] | None:
        """What the style gives each of the module's own parameters, by name."""
        where = _where(path)
        nested = _nested_parameters(module, path)
        if nested:
            msg = (
                f"{where} (plan key {quote(key)}): {type(style).__name__} distributes every "
                f"parameter of the module, and its submodules hold {', '.join(nested[:3])}, "
                "which torch cannot re-register (it fails); apply the style to the submodules "
                "instead"
            )
            self.problems.add(msg, fqn=path)
            return None
        own = [n for n, _ in own_parameters(module, path, remove_duplicate=True)]
        if kind == "sequence":
            return dict.fromkeys(own, _R)
        linear = isinstance(module, nn.Linear)
        if not linear and not isinstance(module, nn.Embedding):
            msg = (
                f"{where} (plan key {quote(key)}): {type(style).__name__} shards only nn.Linear "
                "and nn.Embedding (torch raises NotImplementedError), and this is a "
                f"{type(module).__qualname__}; give it SequenceParallel, a Prepare* style, or "
                "no style"
            )
            self.problems.add(msg, fqn=path)
            return None
        if kind == "colwise":
            return dict.fromkeys(own, _S0 if linear else _S1)
        if linear:
            return {"weight": _S1, "bias": _R}
        return dict.fromkeys(own, _S0)


def _nested_parameters(module: nn.Module, path: str) -> list[str]:
    """The names ``module.named_parameters()`` gives that hold a dot (a submodule's), each
    parameter under its first name, walked without recursion (a deep subtree is fine)."""
    seen: set[nn.Parameter] = set()  # parameters hash by identity
    out: list[str] = []
    for name, param in named_parameters(module, path):
        if param not in seen:
            seen.add(param)
            if "." in name:
                out.append(name)
    return out


def plan_from_parallelize(
    module: nn.Module,
    plan: ParallelizePlan,
    *,
    axis: AxisLike = "tp",
    mesh_axes: Iterable[AxisLike],
) -> ShardingPlan:
    """The ``ShardingPlan`` giving each parameter what ``parallelize_module`` gives it.

    ``plan`` is what ``parallelize_module(module, mesh[axis], plan)`` takes: a dict from
    module FQN (``fnmatch`` patterns per dotted token: ``layers.*.attention.wq``,
    ``layers.[0-3].mlp``; ``""`` for the module itself) to a ``ParallelStyle`` or to a
    nested dict, or one style for the whole module. Keys are matched against
    ``named_children`` level by level, exactly as torch does. The model is only read:
    call this before or after torch applies the plan, with the same answer.

    >>> from torch import nn
    >>> from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    >>> mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
    >>> plan = plan_from_parallelize(mlp, {"0": ColwiseParallel(), "2": RowwiseParallel()},
    ...                              mesh_axes=["dp_shard", "tp"])
    >>> for fqn, _, named in plan.named_placements():
    ...     print(fqn, {a: str(p) for a, p in named.items()})
    0.weight {'tp': 'S(0)'}
    0.bias {'tp': 'S(0)'}
    2.weight {'tp': 'S(1)'}
    2.bias {'tp': 'R'}

    Args:
        module: the model, as it is handed to ``parallelize_module``.
        plan: the styles by module key, or one style.
        axis: the mesh axis the plan's 1-D mesh is (``mesh["tp"]``).
        mesh_axes: the run's axis names, for the plan's ``mesh_axes``; must hold ``axis``.

    Returns:
        One ``{axis: placement}`` per parameter a style distributes, in the model's
        parameter order, and ``tied_pairs`` for FQNs that still share one parameter
        after torch has replaced the distributed ones.

    Raises:
        LayoutError: ``module`` is not a module, ``axis`` not among ``mesh_axes``, or
            the plan leads more than 256 levels deep (nested dicts and dotted key
            tokens together: a plan that holds itself), or the model's walk of its
            modules, parameters or children raised (naming the walk and the module, the
            model's exception the ``__cause__``).
        BindError: a module of the model holds one of its ancestors (a cycle of
            submodules), naming the path that closes it.
        PlanError: every problem of the plan at once, each naming the module FQN and
            the style: a style other than torch's own (or a subclass overriding how it
            distributes), ``ColwiseParallel``/``RowwiseParallel`` on a module that is
            neither ``nn.Linear`` nor ``nn.Embedding``, a module distributed twice, a
            style on a module whose submodules hold parameters, a key that reaches no
            module — each a case where torch raises, or warns and skips.
    """
    root = check_module(module, "plan_from_parallelize(module=...)")
    axes = as_axes(mesh_axes, "plan_from_parallelize(mesh_axes=...)")
    name = axis_in(axis, axes, "plan_from_parallelize(axis=...)").name
    modules = list(named_modules(root))  # first: a cycle of submodules is refused here
    problems = Problems("plan_from_parallelize")
    walk = _Walk(problems)
    walk.plan(root, "", plan, "")
    problems.raise_any()

    placements: dict[str, dict[str, Placement]] = {}
    # The FQNs naming one parameter afterwards: one no style replaced, or the new one a
    # style registered in a module's slot.
    kept: dict[nn.Parameter, list[str]] = {}
    new: dict[tuple[nn.Module, str], list[str]] = {}
    groups: list[list[str]] = []  # both, in the order first named
    for path, owner in modules:
        for leaf, param in own_parameters(owner, path):
            fqn = param_fqn(path, leaf)
            p = walk.written.get((owner, leaf))
            if p is None:
                group = kept.setdefault(param, [])
            else:
                placements[fqn] = {name: p}
                group = new.setdefault((owner, leaf), [])
            if not group:
                groups.append(group)
            group.append(fqn)
    tied = [(group[0], other) for group in groups for other in group[1:]]
    return sharding_plan(placements, mesh_axes=axes, tied_pairs=tied)
