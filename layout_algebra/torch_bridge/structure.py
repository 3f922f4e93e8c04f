"""What each weight's dims are made of, read off a model: heads, fused blocks, experts.

Read from the modules themselves and, for transformers models, their config:

- attention (transformers' ``q_proj``/``k_proj``/``v_proj``/``o_proj``, torchtitan's
  ``wq``/``wk``/``wv``/``wo``): the rows of q, k and v (weight and bias) are heads, and so
  are the columns of o; DeepSeek's multi-head latent attention (``q_b_proj``,
  ``kv_b_proj``) has heads of its own widths;
- fused projections: transformers' ``qkv_proj`` is ``[q | k | v]`` (Phi-3), torchtitan's
  ``wqkv`` is one block per KV head (``heads_per_kv`` q heads, a k and a v head), a 2-D
  ``gate_up_proj`` is ``[gate | up]``; GPT-NeoX's ``query_key_value`` (and the same
  layout of GPT-NeoX-Japanese, Persimmon and Bloom, whose forwards view its output as
  ``(..., heads, 3, head)``) is one unit ``[q_h | k_h | v_h]`` per head, and CodeGen's
  ``qkv_proj`` is ``mp_num`` (4) blocks, each a quarter of the heads' q, v and k, which
  its forward views whole (``view(..., -1, 3 * embed_dim // mp_num)``); their output
  projections' columns (``dense``, ``out_proj``) are heads. Each is found by the class
  whose forward fixes it, since nothing else on the module says how its rows interleave;
- experts: a module with ``num_experts`` and 3-D weights has its experts on dim 0; a
  transformers experts module's ``gate_up_proj`` is ``[gate | up]`` (``is_concatenated``)
  or gate and up interleaved (GPT-OSS: units of 2), on its output dim (``is_transposed``
  says which; a module without it, as Llama 4's, which multiplies ``x @ gate_up_proj``,
  is read by its ``down_proj``: ``(E, H, 2I)`` with ``(E, I, H)`` is transposed).

A module's own head fields win over the config's, since its forward splits heads by them:
q and k heads are the module's ``head_k_dim`` (a gated delta net's key heads), v heads and
o's columns its ``head_v_dim`` or ``v_head_dim`` (a linear attention's value heads,
MiMo-V2-Flash's narrower v heads), each else its ``head_dim``, else the config's head dim
(``head_dim``, or ``hidden_size / num_attention_heads``). What is not read is left out (no
structure); ``structure=`` adds or overrides by FQN or pattern.

Every attribute is read with the bridge's one rule (``_checks.read_attr``): an attribute
the model, its config or a module lacks says nothing, and one that raises while it is read
(a ``config`` property that fails, an experts module's ``is_transposed``, a ``tp_plan``
whose items cannot be read) is a ``LayoutError`` naming it, the model's exception its
``__cause__``. So is a ``tp_plan`` that is not a mapping of names to style names.

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

from layout_algebra._args import mapping_items, plain_str
from layout_algebra._frozen import FrozenMap
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._text import clip, quote
from layout_algebra.errors import LayoutError
from layout_algebra.plan import param_fqn
from layout_algebra.structure import EXPERTS, Packed, Part, as_structure
from layout_algebra.torch_bridge._checks import read_attr, reading
from layout_algebra.torch_bridge._walk import children, named_modules, own_parameters

__all__ = ["structure_from_module"]

Structure = Mapping[int, Packed]

_EXAMPLE: Final = (
    "{'layers.*.mlp.gate_up_proj.weight': {0: Packed([Part('gate', 64), Part('up', 64)])}}"
)


def _of(path: str, name: str) -> str:
    """An attribute of the module at ``path``, as a message names it."""
    return f"the {name} of module {quote(path)}" if path else f"the {name} of the model"


def _attr(obj: object, name: str, shown: str, *, fqn: str | None = None) -> object:
    """``obj.name``, ``None`` when it has none (``read_attr``, a failure named ``shown``)."""
    remedy = f"the structure of the model's weights cannot be read: fix {shown}"
    return read_attr(obj, name, shown, remedy=remedy, fqn=fqn)


def _size(value: object) -> int | None:
    """``value`` when it is an int > 0 (not a bool): a head count or size; else ``None``."""
    return value if type(value) is int and value > 0 else None


def _positive(module: nn.Module, path: str, name: str) -> int | None:
    """The module at ``path``'s own ``name`` when it is an int > 0, else ``None``."""
    return _size(_attr(module, name, _of(path, name), fqn=path or None))


def _text_config(model: nn.Module) -> tuple[object, str]:
    """The model's (text) config and how a message names it."""
    config = _attr(model, "config", "model.config")
    text = _attr(config, "get_text_config", "model.config.get_text_config")
    if not callable(text):
        return config, "model.config"
    shown = "model.config.get_text_config()"
    with reading(shown, remedy=f"the structure of the model's weights cannot be read: fix {shown}"):
        return text(), shown


def _children(module: nn.Module, path: str) -> dict[str, nn.Module]:
    return dict(children(module, path))


def _own(module: nn.Module, path: str) -> dict[str, nn.Parameter]:
    return dict(own_parameters(module, path))


def _weight(
    module: nn.Module, path: str, child: str, leaf: str = "weight"
) -> tuple[int, ...] | None:
    """The shape of ``module.child.leaf`` (``module`` at ``path``), when there is such a
    parameter."""
    sub = _children(module, path).get(child)
    param = None if sub is None else _own(sub, param_fqn(path, child)).get(leaf)
    return None if param is None else tuple(param.shape)


_PER_HEAD_QKV: Final = {
    "GPTNeoXAttention": "head_size",
    "GPTNeoXJapaneseAttention": "head_size",
    "PersimmonAttention": "head_dim",
    "BloomAttention": "head_dim",
}
"""Attention classes whose forward views ``query_key_value``'s output per head, ``(...,
heads, 3 * head)``: its rows are one ``[q_h | k_h | v_h]`` block per head, ``head`` the
module attribute named here."""

_CODEGEN: Final = "CodeGenAttention"
_CODEGEN_MP: Final = 4
"""CodeGen's ``mp_num``: the module's own in recent releases, a constant of the forward
before."""


def _classes(module: nn.Module) -> frozenset[str]:
    """The names of ``module``'s class and its bases (a subclass keeps their forward)."""
    return frozenset(cls.__name__ for cls in type(module).__mro__)


def _heads(name: str, rows: int, head_dim: int) -> Packed | None:
    return (
        Packed([Part(name, rows // head_dim, head_dim)]) if rows and rows % head_dim == 0 else None
    )


class _Reader:
    """Collects each parameter's structure by FQN, module by module."""

    def __init__(self, model: nn.Module) -> None:
        self.config, self.config_shown = _text_config(model)
        self.found: dict[str, dict[int, Packed]] = {}

    def put(self, path: str, child: str, leaf: str, dim: int, packed: Packed | None) -> None:
        fqn = param_fqn(param_fqn(path, child) if child else path, leaf)
        if packed is not None:
            self.found.setdefault(fqn, {})[dim] = packed

    def config_int(self, name: str) -> int | None:
        """The config's ``name`` when it is an int > 0."""
        return _size(_attr(self.config, name, f"{self.config_shown}.{name}"))

    def head_dim(self, path: str, module: nn.Module) -> int | None:
        return _positive(module, path, "head_dim") or self.config_int("head_dim") or self._split()

    def _split(self) -> int | None:
        hidden = self.config_int("hidden_size")
        heads = self.config_int("num_attention_heads")
        return hidden // heads if hidden and heads and hidden % heads == 0 else None

    def module(self, path: str, module: nn.Module) -> None:
        children = _children(module, path)
        if "o_proj" in children and ("q_proj" in children or "qkv_proj" in children):
            self.attention(path, module, ("q_proj", "k_proj", "v_proj", "o_proj"))
        if "kv_b_proj" in children:
            self.latent_attention(path, module, ("q_proj", "q_b_proj"), "kv_b_proj", "o_proj")
        if "query_key_value" in children or "qkv_proj" in children:
            self.fused_by_class(path, module)
        if "wkv_b" in children:
            self.latent_attention(path, module, ("wq", "wq_b"), "wkv_b", "wo")
        elif "wo" in children and _positive(module, path, "n_heads"):
            self.titan_attention(path, module)
        if "gate_up_proj" in children:
            shape = _weight(module, path, "gate_up_proj")
            if shape is not None and len(shape) == 2 and shape[0] % 2 == 0:
                half = shape[0] // 2
                self.put(
                    path,
                    "gate_up_proj",
                    "weight",
                    0,
                    Packed([Part("gate", half), Part("up", half)]),
                )
        if _positive(module, path, "num_experts") and any(
            p.ndim == 3 for p in _own(module, path).values()
        ):
            self.experts(path, module)

    def attention(self, path: str, module: nn.Module, names: tuple[str, str, str, str]) -> None:
        """q, k, v (rows) and o (columns) in heads. Each head size is the module's own when
        it carries one: a linear attention (gated delta net) has key heads of ``head_k_dim``
        and value heads of ``head_v_dim``, and v and o follow ``v_head_dim`` where it differs
        from ``head_dim``; the config's head dim is the last resort."""
        head_dim = self.head_dim(path, module)
        qk = _positive(module, path, "head_k_dim") or head_dim
        v = _positive(module, path, "head_v_dim") or _positive(module, path, "v_head_dim")
        v = v or head_dim
        q_name, k_name, v_name, o_name = names
        for child, part, size in ((q_name, "q", qk), (k_name, "k", qk), (v_name, "v", v)):
            for leaf in ("weight", "bias"):
                shape = _weight(module, path, child, leaf)
                if shape and size:
                    self.put(path, child, leaf, 0, _heads(part, shape[0], size))
        shape = _weight(module, path, o_name)
        if shape is not None and len(shape) == 2 and v:
            self.put(path, o_name, "weight", 1, _heads("o", shape[1], v))
        qkv = _weight(module, path, "qkv_proj")
        heads = self.config_int("num_attention_heads")
        kv = self.config_int("num_key_value_heads") or heads
        if qkv and heads and kv and head_dim and qkv[0] == (heads + 2 * kv) * head_dim:
            packed = Packed(
                [Part("q", heads, head_dim), Part("k", kv, head_dim), Part("v", kv, head_dim)]
            )
            self.put(path, "qkv_proj", "weight", 0, packed)

    def fused_by_class(self, path: str, module: nn.Module) -> None:
        """A fused projection whose interleaving only its class's forward fixes:
        ``_PER_HEAD_QKV``'s per-head blocks, CodeGen's ``mp_num`` blocks."""
        classes = _classes(module)
        found = [attr for name, attr in _PER_HEAD_QKV.items() if name in classes]
        if found:
            self.per_head_qkv(path, module, found[0])
        elif _CODEGEN in classes:
            self.codegen_qkv(path, module)

    def per_head_qkv(self, path: str, module: nn.Module, head_attr: str) -> None:
        """``query_key_value`` viewed as ``(..., heads, 3 * head)``: 4 heads of 8 are 4
        units of 24 rows, q, k and v of one head each; ``dense``'s columns are heads."""
        head = _positive(module, path, head_attr)
        if head is None:
            return
        for leaf in ("weight", "bias"):
            shape = _weight(module, path, "query_key_value", leaf)
            if shape:
                self.put(path, "query_key_value", leaf, 0, _heads("qkv", shape[0], 3 * head))
        shape = _weight(module, path, "dense")
        if shape is not None and len(shape) == 2:
            self.put(path, "dense", "weight", 1, _heads("o", shape[1], head))

    def codegen_qkv(self, path: str, module: nn.Module) -> None:
        """CodeGen's ``qkv_proj``: ``mp_num`` blocks ``[q_b | v_b | k_b]``, each a quarter
        of the heads, which the forward views whole (``3 * embed_dim // mp_num`` rows) and
        splits; a rank holding part of a block has no shape it can view. 32 features over
        4 heads of 8: ``[qvk: 4x24]``. ``out_proj``'s columns are heads."""
        mp = _positive(module, path, "mp_num") or _CODEGEN_MP
        shape = _weight(module, path, "qkv_proj")
        if shape and shape[0] % mp == 0:
            self.put(path, "qkv_proj", "weight", 0, Packed([Part("qvk", mp, shape[0] // mp)]))
        head = _positive(module, path, "head_dim")
        shape = _weight(module, path, "out_proj")
        if shape is not None and len(shape) == 2 and head:
            self.put(path, "out_proj", "weight", 1, _heads("o", shape[1], head))

    def latent_attention(
        self, path: str, module: nn.Module, qs: tuple[str, str], kv: str, o: str
    ) -> None:
        """DeepSeek's multi-head latent attention (transformers' and torchtitan's): q heads
        of ``qk_head_dim``, kv heads of ``qk_nope_head_dim + v_head_dim`` (k's part and v's,
        per head), o of ``v_head_dim``."""
        qk = _positive(module, path, "qk_head_dim")
        nope, v = _positive(module, path, "qk_nope_head_dim"), _positive(module, path, "v_head_dim")
        for child in qs:
            shape = _weight(module, path, child)
            if shape and qk:
                self.put(path, child, "weight", 0, _heads("q", shape[0], qk))
        shape = _weight(module, path, kv)
        if shape and nope and v:
            self.put(path, kv, "weight", 0, _heads("kv", shape[0], nope + v))
        shape = _weight(module, path, o)
        if shape is not None and len(shape) == 2 and v:
            self.put(path, o, "weight", 1, _heads("o", shape[1], v))

    def titan_attention(self, path: str, module: nn.Module) -> None:
        """torchtitan's attention: ``qkv_linear.wq/wk/wv`` or the fused ``qkv_linear.wqkv``
        (a block of ``heads_per_kv`` q heads, one k and one v head per KV head), ``wo``."""
        head_dim = _positive(module, path, "head_dim")
        if head_dim is None:
            return
        inner = _children(module, path).get("qkv_linear")
        inner_path = param_fqn(path, "qkv_linear")
        if inner is not None:
            for child, part in (("wq", "q"), ("wk", "k"), ("wv", "v")):
                shape = _weight(inner, inner_path, child)
                if shape:
                    self.put(inner_path, child, "weight", 0, _heads(part, shape[0], head_dim))
            shape = _weight(inner, inner_path, "wqkv")
            per_kv = _positive(inner, inner_path, "heads_per_kv")
            if shape and per_kv:
                block = (per_kv + 2) * head_dim
                self.put(inner_path, "wqkv", "weight", 0, _heads("kv_groups", shape[0], block))
        shape = _weight(module, path, "wo")
        if shape is not None and len(shape) == 2:
            self.put(path, "wo", "weight", 1, _heads("o", shape[1], head_dim))

    def experts(self, path: str, module: nn.Module) -> None:
        count = _positive(module, path, "num_experts")
        assert count is not None
        where = path or None
        transposed = _attr(module, "is_transposed", _of(path, "is_transposed"), fqn=where)
        concatenated = _attr(module, "is_concatenated", _of(path, "is_concatenated"), fqn=where)
        own = _own(module, path)
        if not isinstance(transposed, bool):
            transposed = _transposed_by_shape(own)
        for leaf, param in own.items():
            if param.ndim < 2 or param.shape[0] != count:
                continue
            self.put(path, "", leaf, 0, Packed([Part(EXPERTS, count)]))
            if leaf not in ("gate_up_proj", "gate_up_proj_bias") or transposed is None:
                continue  # which dim is gate and up is not known: no structure says it
            # the output dim: (E, 2I, H), or (E, H, 2I) transposed; a bias's is its last
            dim = param.ndim - 1 if transposed is True or param.ndim == 2 else param.ndim - 2
            n = int(param.shape[dim])
            if n % 2:
                continue
            packed = (
                Packed([Part("gate", n // 2), Part("up", n // 2)])
                if concatenated is not False
                else Packed([Part("gate_up", n // 2, 2)])
            )
            self.put(path, "", leaf, dim, packed)


def _transposed_by_shape(params: Mapping[str, nn.Parameter]) -> bool | None:
    """Whether an experts module without ``is_transposed`` multiplies ``x @ w`` (True:
    ``gate_up_proj`` ``(E, H, 2I)`` with ``down_proj`` ``(E, I, H)``, as Llama 4's chunks
    ``bmm(x, gate_up_proj)`` on its last dim) or ``w @ x`` (False: ``(E, 2I, H)`` with
    ``(E, H, I)``), read from the two weights' shapes; ``None`` when they say neither."""
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if gate_up is None or down is None or gate_up.ndim != 3 or down.ndim != 3:
        return None
    _, rows, cols = gate_up.shape
    _, down_rows, down_cols = down.shape
    if rows == down_cols and cols == 2 * down_rows:
        return True
    if cols == down_rows and rows == 2 * down_cols:
        return False
    return None


_WHOLE_STYLES: Final = frozenset(
    {"colwise_gather_output", "colwise_rep", "rowwise_split_input", "rowwise_rep"}
)
"""transformers' styles whose module computes on the whole weight's output or input."""


def _computed_whole(model: nn.Module) -> Matcher[str]:
    """The keys of the model's own ``tp_plan`` (``*`` one segment, as its layer numbers)
    whose style computes the module whole; none when it has no such plan.

    Raises:
        LayoutError: the plan raises while it is read, or is not a mapping of names to
            style names (transformers reads none other), naming ``model.tp_plan``.
    """
    plan = _attr(model, "tp_plan", "model.tp_plan")
    if plan is None:
        return Matcher([])
    example = "{'model.layers.*.self_attn.q_proj': 'colwise'}"
    raw: object = plan
    if not isinstance(raw, Mapping):
        msg = (
            f"model.tp_plan must map module names to transformers' style names such as "
            f"{example}, got {quote(raw)}; fix the model's tp_plan"
        )
        raise LayoutError(msg)
    rules: list[Rule[str]] = []
    for key, style in mapping_items(raw, "model.tp_plan", example):
        if not isinstance(key, str) or not isinstance(style, str):
            msg = (
                f"model.tp_plan maps {quote(key)} to {quote(style)}, not a module name to a "
                f"style name such as {example} (transformers refuses it); fix the model's "
                "tp_plan"
            )
            raise LayoutError(msg)
        if key and style in _WHOLE_STYLES:
            rules.append(Rule(plain_str(key), plain_str(style)))
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
            different structures (naming the keys); or an attribute of the model, its
            config or a module raised while it was read, or the model's ``tp_plan`` is not
            a mapping of names to style names (naming it).
    """
    reader = _Reader(module)
    params: list[tuple[str, str]] = []  # (module path, parameter FQN)
    for path, sub in named_modules(module):
        reader.module(path, sub)
        params.extend((path, param_fqn(path, leaf)) for leaf in _own(sub, path))
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
            keys = ", ".join(quote(r.key) for r in best)
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
