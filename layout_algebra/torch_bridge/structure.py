"""What each weight's dims are made of, read off a model: heads, fused blocks, experts.

Read from the modules themselves and, for transformers models, their config:

- attention (transformers' ``q_proj``/``k_proj``/``v_proj``/``o_proj``, torchtitan's
  ``wq``/``wk``/``wv``/``wo``): the rows of q, k and v (weight and bias) are heads of
  ``head_dim``, and so are the columns of o; DeepSeek's multi-head latent attention
  (``q_b_proj``, ``kv_b_proj``) has heads of its own widths;
- fused projections: transformers' ``qkv_proj`` is ``[q | k | v]`` (Phi-3), torchtitan's
  ``wqkv`` is one block per KV head (``heads_per_kv`` q heads, a k and a v head), a 2-D
  ``gate_up_proj`` is ``[gate | up]``;
- experts: a module with ``num_experts`` and 3-D weights has its experts on dim 0; a
  transformers experts module's ``gate_up_proj`` is ``[gate | up]`` (``is_concatenated``)
  or gate and up interleaved (GPT-OSS: units of 2), on its output dim (``is_transposed``
  says which).

The head dim is the attention module's ``head_dim`` when it has one, else the config's.
What is not read is left out (no structure); ``structure=`` adds or overrides by FQN or
pattern.

A weight whose module the model's own ``tp_plan`` gives a style that computes it whole
(``colwise_gather_output`` and ``colwise_rep`` gather the output before it is used,
``rowwise_split_input`` and ``rowwise_rep`` split a whole input to match the weight) is
left out too: its shards never meet its structure, as Phi-3's fused ``qkv_proj`` and
``gate_up_proj`` under its own plan. To lint another plan for such a model, give the
structure with ``structure=`` (``structure_from_module`` of the model with its
``tp_plan`` emptied reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from torch import nn

from layout_algebra._args import mapping_items
from layout_algebra._frozen import FrozenMap
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._text import clip, quote
from layout_algebra.errors import LayoutError
from layout_algebra.plan import param_fqn
from layout_algebra.structure import EXPERTS, Packed, Part, as_structure
from layout_algebra.torch_bridge._walk import named_modules

__all__ = ["structure_from_module"]

Structure = Mapping[int, Packed]

_EXAMPLE: Final = (
    "{'layers.*.mlp.gate_up_proj.weight': {0: Packed([Part('gate', 64), Part('up', 64)])}}"
)


def _positive(obj: object, name: str) -> int | None:
    """``obj.name`` when it is an int > 0 (not a bool), else ``None``; never raises."""
    try:
        value = getattr(obj, name, None)
    except Exception:  # a config's property may raise: no structure from it then
        return None
    return value if type(value) is int and value > 0 else None


def _text_config(module: nn.Module) -> object:
    config = getattr(module, "config", None)
    text = getattr(config, "get_text_config", None)
    if callable(text):
        try:
            return text()
        except Exception:  # a config that cannot say: read the modules alone
            return config
    return config


def _children(module: nn.Module) -> dict[str, nn.Module]:
    return dict(module.named_children())


def _own(module: nn.Module) -> dict[str, nn.Parameter]:
    return dict(module.named_parameters(recurse=False, remove_duplicate=False))


def _weight(module: nn.Module, child: str, leaf: str = "weight") -> tuple[int, ...] | None:
    """The shape of ``module.child.leaf``, when there is such a parameter."""
    sub = _children(module).get(child)
    param = None if sub is None else _own(sub).get(leaf)
    return None if param is None else tuple(param.shape)


def _heads(name: str, rows: int, head_dim: int) -> Packed | None:
    return (
        Packed([Part(name, rows // head_dim, head_dim)]) if rows and rows % head_dim == 0 else None
    )


class _Reader:
    """Collects each parameter's structure by FQN, module by module."""

    def __init__(self, model: nn.Module) -> None:
        self.config = _text_config(model)
        self.found: dict[str, dict[int, Packed]] = {}

    def put(self, path: str, child: str, leaf: str, dim: int, packed: Packed | None) -> None:
        fqn = param_fqn(param_fqn(path, child) if child else path, leaf)
        if packed is not None:
            self.found.setdefault(fqn, {})[dim] = packed

    def head_dim(self, module: nn.Module) -> int | None:
        return _positive(module, "head_dim") or _positive(self.config, "head_dim") or self._split()

    def _split(self) -> int | None:
        hidden = _positive(self.config, "hidden_size")
        heads = _positive(self.config, "num_attention_heads")
        return hidden // heads if hidden and heads and hidden % heads == 0 else None

    def module(self, path: str, module: nn.Module) -> None:
        children = _children(module)
        if "o_proj" in children and ("q_proj" in children or "qkv_proj" in children):
            self.attention(path, module, ("q_proj", "k_proj", "v_proj", "o_proj"))
        if "kv_b_proj" in children:
            self.latent_attention(path, module, ("q_proj", "q_b_proj"), "kv_b_proj", "o_proj")
        if "wkv_b" in children:
            self.latent_attention(path, module, ("wq", "wq_b"), "wkv_b", "wo")
        elif "wo" in children and _positive(module, "n_heads"):
            self.titan_attention(path, module)
        if "gate_up_proj" in children:
            shape = _weight(module, "gate_up_proj")
            if shape is not None and len(shape) == 2 and shape[0] % 2 == 0:
                half = shape[0] // 2
                self.put(
                    path,
                    "gate_up_proj",
                    "weight",
                    0,
                    Packed([Part("gate", half), Part("up", half)]),
                )
        if _positive(module, "num_experts") and any(p.ndim == 3 for p in _own(module).values()):
            self.experts(path, module)

    def attention(self, path: str, module: nn.Module, names: tuple[str, str, str, str]) -> None:
        head_dim = self.head_dim(module)
        if head_dim is None:
            return
        q, k, v, o = names
        for child, part in ((q, "q"), (k, "k"), (v, "v")):
            for leaf in ("weight", "bias"):
                shape = _weight(module, child, leaf)
                if shape:
                    self.put(path, child, leaf, 0, _heads(part, shape[0], head_dim))
        shape = _weight(module, o)
        if shape is not None and len(shape) == 2:
            self.put(path, o, "weight", 1, _heads("o", shape[1], head_dim))
        qkv = _weight(module, "qkv_proj")
        heads = _positive(self.config, "num_attention_heads")
        kv = _positive(self.config, "num_key_value_heads") or heads
        if qkv and heads and kv and qkv[0] == (heads + 2 * kv) * head_dim:
            packed = Packed(
                [Part("q", heads, head_dim), Part("k", kv, head_dim), Part("v", kv, head_dim)]
            )
            self.put(path, "qkv_proj", "weight", 0, packed)

    def latent_attention(
        self, path: str, module: nn.Module, qs: tuple[str, str], kv: str, o: str
    ) -> None:
        """DeepSeek's multi-head latent attention (transformers' and torchtitan's): q heads
        of ``qk_head_dim``, kv heads of ``qk_nope_head_dim + v_head_dim`` (k's part and v's,
        per head), o of ``v_head_dim``."""
        qk = _positive(module, "qk_head_dim")
        nope, v = _positive(module, "qk_nope_head_dim"), _positive(module, "v_head_dim")
        for child in qs:
            shape = _weight(module, child)
            if shape and qk:
                self.put(path, child, "weight", 0, _heads("q", shape[0], qk))
        shape = _weight(module, kv)
        if shape and nope and v:
            self.put(path, kv, "weight", 0, _heads("kv", shape[0], nope + v))
        shape = _weight(module, o)
        if shape is not None and len(shape) == 2 and v:
            self.put(path, o, "weight", 1, _heads("o", shape[1], v))

    def titan_attention(self, path: str, module: nn.Module) -> None:
        """torchtitan's attention: ``qkv_linear.wq/wk/wv`` or the fused ``qkv_linear.wqkv``
        (a block of ``heads_per_kv`` q heads, one k and one v head per KV head), ``wo``."""
        head_dim = _positive(module, "head_dim")
        if head_dim is None:
            return
        inner = _children(module).get("qkv_linear")
        inner_path = param_fqn(path, "qkv_linear")
        if inner is not None:
            for child, part in (("wq", "q"), ("wk", "k"), ("wv", "v")):
                shape = _weight(inner, child)
                if shape:
                    self.put(inner_path, child, "weight", 0, _heads(part, shape[0], head_dim))
            shape = _weight(inner, "wqkv")
            per_kv = _positive(inner, "heads_per_kv")
            if shape and per_kv:
                block = (per_kv + 2) * head_dim
                self.put(inner_path, "wqkv", "weight", 0, _heads("kv_groups", shape[0], block))
        shape = _weight(module, "wo")
        if shape is not None and len(shape) == 2:
            self.put(path, "wo", "weight", 1, _heads("o", shape[1], head_dim))

    def experts(self, path: str, module: nn.Module) -> None:
        count = _positive(module, "num_experts")
        assert count is not None
        transposed = getattr(module, "is_transposed", False) is True
        concatenated = getattr(module, "is_concatenated", True) is not False
        for leaf, param in _own(module).items():
            if param.ndim < 2 or param.shape[0] != count:
                continue
            self.put(path, "", leaf, 0, Packed([Part(EXPERTS, count)]))
            if leaf not in ("gate_up_proj", "gate_up_proj_bias"):
                continue
            # the output dim: (E, 2I, H), or (E, H, 2I) transposed; a bias's is its last
            dim = param.ndim - 1 if transposed or param.ndim == 2 else param.ndim - 2
            n = int(param.shape[dim])
            if n % 2:
                continue
            packed = (
                Packed([Part("gate", n // 2), Part("up", n // 2)])
                if concatenated
                else Packed([Part("gate_up", n // 2, 2)])
            )
            self.put(path, "", leaf, dim, packed)


_WHOLE_STYLES: Final = frozenset(
    {"colwise_gather_output", "colwise_rep", "rowwise_split_input", "rowwise_rep"}
)
"""transformers' styles whose module computes on the whole weight's output or input."""


def _computed_whole(model: nn.Module) -> Matcher[str]:
    """The keys of the model's own ``tp_plan`` (``*`` one segment, as its layer numbers)
    whose style computes the module whole; none when it has no such plan."""
    try:
        plan = getattr(model, "tp_plan", None)
    except Exception:  # a model that cannot say: every structure is kept
        plan = None
    rules: list[Rule[str]] = []
    if isinstance(plan, Mapping):
        for key, style in list(plan.items()):
            if isinstance(key, str) and key and style in _WHOLE_STYLES:
                rules.append(Rule(key, str(style)))
    return Matcher(rules)


def structure_from_module(
    module: nn.Module, *, structure: Mapping[str, Structure] | None = None
) -> dict[str, FrozenMap[int, Packed]]:
    """Each parameter's structure by FQN, as the model says it (see the module's doc),
    with ``structure`` (by FQN or pattern, ``*`` one segment) given for what it names:
    the most specific key's structure replaces the parameter's (``{}`` drops it); a key
    naming a module gives each of its parameters that structure, unless a key names the
    parameter itself.

    Raises:
        LayoutError: ``structure`` is not a mapping of FQN or pattern to ``{dim: Packed}``,
            a key matches no parameter, or two keys equally specific give one parameter
            different structures (naming the keys).
    """
    reader = _Reader(module)
    params: list[tuple[str, str]] = []  # (module path, parameter FQN)
    for path, sub in named_modules(module):
        reader.module(path, sub)
        params.extend((path, param_fqn(path, leaf)) for leaf in _own(sub))
    whole = _computed_whole(module)
    found = {
        fqn: FrozenMap(dict(sorted(s.items())))
        for fqn, s in reader.found.items()
        if not (whole.best(fqn) or whole.best(fqn.rpartition(".")[0]))
    }
    if structure is not None:
        found.update(_overrides(structure, params))
    return found


def _overrides(
    structure: Mapping[str, Structure], params: list[tuple[str, str]]
) -> dict[str, FrozenMap[int, Packed]]:
    """The structure ``structure`` gives each parameter: by its own FQN (or a pattern of
    it), else by its module's (every parameter of ``layers.*.mlp.gate_up_proj``)."""
    arg = "shapes_from_module(structure=...)"
    raw: object = structure
    if not isinstance(raw, Mapping):
        msg = (
            f"{arg} must map parameter FQNs or patterns to {{dim: Packed}}, such as "
            f"{_EXAMPLE}, got {quote(raw)}"
        )
        raise LayoutError(msg)
    rules: list[Rule[FrozenMap[int, Packed]]] = []
    for key, value in mapping_items(structure, arg, _EXAMPLE):
        raw_key: object = key
        if not isinstance(raw_key, str) or not key:
            msg = f"{arg} is keyed by parameter FQNs or patterns, got {quote(raw_key)}"
            raise LayoutError(msg)
        rules.append(Rule(key, as_structure(value, f"{arg}[{clip(key)!r}]")))
    matcher = Matcher(rules)
    out: dict[str, FrozenMap[int, Packed]] = {}
    for path, fqn in dict.fromkeys(params):
        best = matcher.best(fqn) or (matcher.best(path) if path else ())
        if len({r.value for r in best}) > 1:
            keys = ", ".join(repr(r.key) for r in best)
            msg = (
                f"{fqn}: {arg} gives it different structures by equally specific keys "
                f"({keys}); give it one, or an exact key"
            )
            raise LayoutError(msg, fqn=fqn)
        if best:
            out[fqn] = best[0].value
    unused = matcher.unused()
    if unused:
        keys = ", ".join(repr(clip(r.key)) for r in unused[:5])
        msg = (
            f"{arg} has keys that match no parameter or module: {keys}; check them against "
            "model.named_parameters() (a * stands for one dotted segment)"
        )
        raise LayoutError(msg)
    return out
