"""The training setup a live model implies: its frozen parameters, and the modules its
library gives ``fully_shard`` one by one.

A transformers model with an FSDP plan is wrapped as transformers' own FSDP2 wraps it
(``from_pretrained(distributed_config=...)``): its ``fsdp_plan`` as transformers itself
resolves it (rules matching no module dropped, a tied embedding folded into the head's
call, modules kept in float32 given their own), each module resharded after forward or
not as its rule says, the final norm and the head (or the tied embedding) in one call
when those two are the kept ones. Any other model is wrapped as torchtitan
(``apply_fsdp_to_decoder``) wraps a decoder: the input embedding alone, each block
(transformers' ``_no_split_modules`` classes, torchtitan's ``layers.<n>``), the final
norm and the output head in one call kept unsharded from its forward to its backward,
then the root; a tied embedding goes into that last call (torchtitan's
``fully_shard([tok_embeddings, norm, lm_head])``). Neither library is needed here: the
model object is read, and transformers is imported only for a model of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from torch import nn

from layout_algebra._text import quote
from layout_algebra._units import compact, repeated_blocks
from layout_algebra.errors import LayoutError
from layout_algebra.torch_bridge._checks import check_module, read_attr, reading
from layout_algebra.torch_bridge._walk import named_modules, named_parameters
from layout_algebra.torch_bridge.models import tied_pairs_from_module
from layout_algebra.training import FSDPUnit, Training

__all__ = ["training_from_module"]

_CALLER = "training_from_module"
_REMEDY = "give units=[...] yourself"


def training_from_module(model: nn.Module, **training: Any) -> Training:
    """``Training(**training)`` completed from ``model``: the frozen parameters, and the
    units when ``training`` names none.

    - ``frozen``: every parameter FQN with ``requires_grad=False``, a ``*`` for a layer
      number where every layer's parameter of that name is frozen (``model.layers.*.mlp.
      up_proj.weight``); given only when some parameter is frozen.
    - ``units``: for a transformers model with an FSDP plan, the calls transformers' own
      FSDP2 makes (its ``fsdp_plan`` as transformers resolves it: the root alone where no
      rule names a module), in module order, layers compacted to patterns. Else, in
      forward order, the input embedding (``get_input_embeddings()``,
      torchtitan's ``tok_embeddings``); the blocks, as patterns (``model.layers.*``): the
      modules whose class transformers lists in ``model._no_split_modules``, else the
      repeated numbered blocks (torchtitan's ``layers.*``); and the final norm (the
      embedding's sibling ``norm``) with the output head (``get_output_embeddings()``,
      torchtitan's ``lm_head`` or ``output``) as one ``FSDPUnit`` not resharded after
      forward, the tied embedding with them. Experts a library wraps on their own mesh
      are not inferred: name them in ``units``.

    >>> model = nn.Module()
    >>> model.tok_embeddings = nn.Embedding(10, 4)
    >>> model.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    >>> model.norm = nn.LayerNorm(4)
    >>> model.output = nn.Linear(4, 10)
    >>> for unit in training_from_module(model, optimizer="sgd").units:
    ...     print(unit)
    tok_embeddings
    layers.*
    [norm, output] (reshard_after_forward=False)

    Args:
        model: the model, on any device (the meta device welcome).
        training: the other arguments of ``Training``, as it takes them.

    Returns:
        The setup.

    Raises:
        BindError: ``model`` is not an ``nn.Module``.
        LayoutError: reading the model raised (naming what was read), or ``Training``
            refuses the arguments.
    """
    check_module(model, f"{_CALLER}(model=...)")
    params = list(named_parameters(model))
    frozen = [fqn for fqn, p in params if not p.requires_grad]
    if frozen and "frozen" not in training:
        training["frozen"] = compact(frozen, [fqn for fqn, _ in params])
    if "units" not in training:
        planned = _planned_units(model)
        training["units"] = _units(model, params) if planned is None else planned
    return Training(**training)


_KEEP, _FREE = "keep_full_weight", "free_full_weight"
"""transformers' FSDP styles: not resharded after forward, and resharded."""


def _planned_units(model: nn.Module) -> tuple[str | FSDPUnit, ...] | None:
    """The units transformers' own FSDP2 gives ``model``, in module order; ``None`` when
    ``model`` is no transformers model with an FSDP plan."""
    resolve = read_attr(
        model, "_resolve_parallel_plans", "model._resolve_parallel_plans", remedy=_REMEDY
    )
    if not callable(resolve) or not type(model).__module__.startswith("transformers."):
        return None
    try:
        config = importlib.import_module("transformers.distributed").DistributedConfig
    except (ImportError, AttributeError):  # a transformers without its own FSDP2
        return None
    shown = "model._resolve_parallel_plans(...)"
    with reading(shown, remedy=_REMEDY, caller=_CALLER):
        try:
            resolved = resolve(config(fsdp_size=2))
        except ValueError:  # transformers has no FSDP plan for this model
            return None
    plan = resolved[2] if isinstance(resolved, tuple) and len(resolved) == 3 else None
    if not isinstance(plan, dict) or not all(isinstance(n, str) for n in plan):
        msg = (
            f"{_CALLER}: {shown} gave {quote(resolved)}, not transformers' tp, ep and FSDP "
            f"plans with the FSDP plan a dict of module names; {_REMEDY}"
        )
        raise LayoutError(msg)
    by_module = {fqn: m for fqn, m in named_modules(model) if fqn}
    order = {fqn: at for at, fqn in enumerate(by_module)}
    named = sorted((n for n in plan if n in order), key=order.__getitem__)
    free = [n for n in named if plan[n] == _FREE]
    kept = [n for n in named if plan[n] == _KEEP]
    embedding = _module(model, "get_input_embeddings", ())
    head = _module(model, "get_output_embeddings", ())
    alias = _tied_head(model, embedding, head, by_module)

    def calls(modules: list[str]) -> list[str]:
        """``modules`` with the tied head beside the embedding that holds its weight."""
        return [*modules, alias[1]] if alias and alias[0] in modules else modules

    units: list[tuple[int, str | FSDPUnit]] = []
    for pattern in compact(free, order):  # in the order of the first module each names
        first = next(n for n in free if _within(n, pattern) and n.count(".") == pattern.count("."))
        together = calls([pattern])
        units.append((order[first], pattern if len(together) == 1 else FSDPUnit(together)))
    ends = [n for n in kept if any(by_module[n] is m for m in (embedding, head))]
    norms = [n for n in kept if n == "norm" or n.endswith(".norm")]
    if len(kept) == 2 and len(ends) == 1 and len(norms) == 1:  # transformers' tail pair
        units.append((order[kept[-1]], FSDPUnit(calls(kept), reshard_after_forward=False)))
    else:
        units.extend((order[n], FSDPUnit(calls([n]), reshard_after_forward=False)) for n in kept)
    return tuple(unit for _, unit in sorted(units, key=lambda item: item[0]))


def _tied_head(
    model: nn.Module,
    embedding: nn.Module | None,
    head: nn.Module | None,
    by_module: dict[str, nn.Module],
) -> tuple[str, str] | None:
    """The embedding's FQN and the head's, when the head's weight is the embedding's: the
    head then runs in the call that holds the embedding (transformers folds its rule into
    the embedding's)."""
    if embedding is None or head is None or embedding is head:
        return None
    names = [
        next((n for n, m in by_module.items() if m is found), None) for found in (embedding, head)
    ]
    held, alias = names
    if held is None or alias is None:
        return None
    for a, b in tied_pairs_from_module(model):
        if {a.rpartition(".")[0], b.rpartition(".")[0]} == {held, alias}:
            return held, alias
    return None


def _units(model: nn.Module, params: list[tuple[str, nn.Parameter]]) -> tuple[str | FSDPUnit, ...]:
    """The embedding, the blocks, and the norm with the head, in forward order."""
    modules = [(fqn, m) for fqn, m in named_modules(model) if fqn]
    holding = {fqn.rpartition(".")[0] for fqn, _ in params}  # modules with own parameters
    classes = _no_split_classes(model)
    if classes:
        chosen = [f for f, m in modules if type(m).__name__ in classes and _holds(f, holding)]
        blocks = compact(chosen, [f for f, _ in modules])
    else:
        blocks = repeated_blocks(f for f, _ in modules)

    def outside(found: nn.Module | None) -> str | None:
        """The FQN of ``found`` (a shared module: its first) when it holds parameters
        outside every block; found by identity, three times a call."""
        fqn = next((f for f, m in modules if m is found), None)
        if fqn is None or not _holds(fqn, holding):
            return None
        return None if any(_within(fqn, block) for block in blocks) else fqn

    embedding = outside(_module(model, "get_input_embeddings", ("tok_embeddings",)))
    head = outside(_module(model, "get_output_embeddings", ("lm_head", "output")))
    parent = "" if embedding is None else embedding.rpartition(".")[0]
    norm = outside(dict(modules).get(f"{parent}.norm" if parent else "norm"))
    tied = {fqn for pair in tied_pairs_from_module(model) for fqn in pair}
    kept = [m for m in (norm, head) if m is not None]
    first: list[str] = []
    if embedding is not None:
        if any(f.startswith(f"{embedding}.") for f in tied) and head is not None:
            kept.insert(0, embedding)  # tied to the head: wrapped with it
        else:
            first.append(embedding)
    last = [FSDPUnit(kept, reshard_after_forward=False)] if kept else []
    return (*first, *blocks, *last)


def _holds(module: str, holding: set[str]) -> bool:
    """Whether the module at ``module`` holds a parameter, itself or below."""
    return any(h == module or h.startswith(f"{module}.") for h in holding)


def _within(fqn: str, pattern: str) -> bool:
    """Whether ``pattern`` (``*``: one segment) names ``fqn`` or a module holding it."""
    want, got = pattern.split("."), fqn.split(".")
    return len(want) <= len(got) and all(w in ("*", g) for w, g in zip(want, got, strict=False))


def _no_split_classes(model: nn.Module) -> frozenset[str]:
    """The class names of transformers' ``_no_split_modules`` (empty: not transformers')."""
    found = read_attr(
        model,
        "_no_split_modules",
        "model._no_split_modules",
        remedy=_REMEDY,
        caller=_CALLER,
    )
    if not isinstance(found, Iterable) or isinstance(found, str | bytes):
        return frozenset()
    return frozenset(name for name in found if isinstance(name, str))


def _module(model: nn.Module, getter: str, attributes: tuple[str, ...]) -> nn.Module | None:
    """The module transformers' ``model.<getter>()`` gives, or torchtitan's attribute of
    one of ``attributes``; ``None`` when the model has none."""
    found: object = None
    get = read_attr(model, getter, f"model.{getter}", remedy=_REMEDY, caller=_CALLER)
    if callable(get):
        with reading(f"model.{getter}()", remedy=_REMEDY, caller=_CALLER):
            try:
                found = get()
            except NotImplementedError:  # transformers' answer for a model without one
                found = None
    for name in attributes:
        if found is None:
            found = read_attr(model, name, f"model.{name}", remedy=_REMEDY, caller=_CALLER)
    return found if isinstance(found, nn.Module) else None
