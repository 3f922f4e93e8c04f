"""What a dim is made of: the parts it is packed from, each of whole units.

A weight's dim is rarely a plain run of features. ``q_proj.weight``'s dim 0 is 32 heads
of 128 rows; a fused ``qkv_proj`` is ``q``, ``k`` and ``v`` one after the other; a fused
``gate_up_proj`` is ``gate`` then ``up``; a fused expert tensor's dim 0 is its experts.
A shard that cuts a head, or that gives a rank only ``gate`` rows, has the right shape and
the wrong rows: ``Packed`` says what the rows are, so the lint can tell.

>>> qkv = Packed([Part("q", 32, 128), Part("k", 8, 128), Part("v", 8, 128)])
>>> str(qkv), len(qkv)
('[q: 32x128 | k: 8x128 | v: 8x128]', 6144)

``structure_to_obj`` and ``structure_from_obj`` are a ``ParamShape``'s structure as JSON
(``{"0": [{"name": "q", "count": 32, "size": 128}, ...]}``, dims as decimal keys);
``part_from_obj`` and ``packed_from_obj`` read one part and one dim's parts, by the same
rules (the converter's hooks for ``Part`` and ``Packed`` call them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

import attrs

from layout_algebra._args import MAX_NDIM, MAX_TENSOR_SIZE, as_instances, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call
from layout_algebra._text import clip, label, quote
from layout_algebra.errors import LayoutError, SerializationError

__all__ = [
    "EXPERTS",
    "Packed",
    "Part",
    "as_structure",
    "structure_from_obj",
    "structure_to_obj",
]

EXPERTS: Final = "experts"
"""The name of a part whose units are whole experts: its count must split evenly."""

_SHOWN_PARTS: Final = 8
"""``str(Packed)`` spells at most this many parts (the first ones and the last)."""
MAX_PARTS: Final = 1 << 16
"""The most parts one dim is packed from (a real one has a handful: q, k, v; gate, up)."""

_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def _check_name(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        msg = (
            f"Part(name) must be a name such as 'q' or 'gate' (letters, digits, _), "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)


def _check_positive(part: Part, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or not 1 <= value <= MAX_TENSOR_SIZE:
        msg = (
            f"Part {clip(str(part.name))!r}: {attribute.name} must be an int >= 1, "
            f"got {quote(value)}; a part is count units of size elements each"
        )
        raise LayoutError(msg)


@checked_call
@attrs.frozen
class Part:
    """``count`` units of ``size`` elements each, one after the other: 32 heads of 128
    are ``Part("q", 32, 128)``, eight experts ``Part("experts", 8)``.

    >>> Part("k", 8, 128)
    Part(name='k', count=8, size=128)
    >>> str(Part("k", 8, 128)), str(Part("experts", 8))
    ('k: 8x128', 'experts: 8')
    """

    name: str = attrs.field(converter=plain_str, validator=_check_name, **REQUIRED)
    count: int = attrs.field(validator=_check_positive, **REQUIRED)
    size: int = attrs.field(default=1, validator=_check_positive)

    def __attrs_pre_init__(self, name: str, count: int, size: int) -> None:
        check_init(self, "name", (name, count, size))

    def __attrs_post_init__(self) -> None:
        if self.count * self.size > MAX_TENSOR_SIZE:
            msg = (
                f"Part {self.name!r}: {self.count} units of {self.size} are more than the "
                "2**63 - 1 elements a dim holds; check count and size"
            )
            raise LayoutError(msg)

    @property
    def length(self) -> int:
        """Elements of the dim the part spans: ``count * size``."""
        return self.count * self.size

    def __str__(self) -> str:
        return f"{clip(self.name)}: {self.count}" + (f"x{self.size}" if self.size != 1 else "")


def _as_parts(value: Sequence[Part]) -> tuple[Part, ...]:
    # in order (the order of the parts is what the dim's rows are), and bounded
    example = "[Part('gate', 64), Part('up', 64)]"
    return as_instances(value, Part, "Packed(parts)", example, limit=MAX_PARTS)


@checked_call
@attrs.frozen(cache_hash=True)
class Packed:
    """A dim made of its parts, in order: ``[gate | up]``, ``[q | k | v]``, or one part.

    >>> gate_up = Packed([Part("gate", 14336), Part("up", 14336)])
    >>> str(gate_up), gate_up.length, gate_up.equal_parts
    ('[gate: 14336 | up: 14336]', 28672, True)
    """

    parts: tuple[Part, ...] = attrs.field(converter=_as_parts, **REQUIRED)

    def __attrs_pre_init__(self, parts: Sequence[Part]) -> None:
        check_init(self, "parts", (parts,))

    @parts.validator
    def _check_parts(self, _: attrs.Attribute[tuple[Part, ...]], value: tuple[Part, ...]) -> None:
        if not value:
            msg = "Packed(parts) needs at least one Part, such as [Part('q', 32, 128)]"
            raise LayoutError(msg)
        seen: set[str] = set()
        for part in value:
            if part.name in seen:
                msg = f"Packed(parts) names the part {part.name!r} twice in {self}; name each once"
                raise LayoutError(msg)
            seen.add(part.name)
        if self.length > MAX_TENSOR_SIZE:
            msg = f"{self} is longer than the 2**63 - 1 elements a dim holds; check the parts"
            raise LayoutError(msg)

    @property
    def length(self) -> int:
        """Elements of the dim: the sum of the parts' ``count * size``."""
        return sum(p.length for p in self.parts)

    def __len__(self) -> int:
        return self.length

    @property
    def equal_parts(self) -> bool:
        """Whether every part is as long as the first (``_S(dim, parts)`` then fits)."""
        return len({p.length for p in self.parts}) == 1

    def spans(self) -> Iterator[tuple[Part, int, int]]:
        """Each part with the ``[start, stop)`` of the dim it spans, in order."""
        start = 0
        for part in self.parts:
            yield part, start, start + part.length
            start += part.length

    def __str__(self) -> str:
        parts = self.parts
        if len(parts) <= _SHOWN_PARTS:
            return "[" + " | ".join(map(str, parts)) + "]"
        # a message shows a dim of thousands of parts by its ends
        shown = [*map(str, parts[: _SHOWN_PARTS - 2]), "...", str(parts[-1])]
        return "[" + " | ".join(shown) + f"] ({len(parts):,} parts)"


def as_structure(value: Mapping[int, Packed], arg: str = "structure") -> FrozenMap[int, Packed]:
    """``value`` as a structure: ``Packed`` by dim (an int from 0 to 63), sorted by dim.

    Raises:
        LayoutError: naming ``arg``: not a mapping, a key that is no dim, a value that is
            no ``Packed``.
    """
    arg = label(arg)
    raw: object = value
    example = "{0: Packed([Part('q', 32, 128)])}"
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map a dim to its Packed parts, such as {example}, got {quote(raw)}"
        raise LayoutError(msg)
    out: dict[int, Packed] = {}
    items = mapping_items(value, arg, example, limit=MAX_NDIM)  # a dim each, so bounded
    if len(items) > MAX_NDIM:
        msg = f"{arg} has more than {MAX_NDIM} dims, more than a tensor has; check it"
        raise LayoutError(msg)
    for dim, packed in items:
        raw_dim: object = dim
        if type(raw_dim) is not int or not 0 <= dim < MAX_NDIM:
            msg = f"{arg} is keyed by dims (ints from 0 to {MAX_NDIM - 1}), got {quote(raw_dim)}"
            raise LayoutError(msg)
        raw_packed: object = packed
        if not isinstance(raw_packed, Packed):
            msg = f"{arg}[{dim}] must be a Packed, such as {example}, got {quote(raw_packed)}"
            raise LayoutError(msg)
        out[dim] = packed
    return FrozenMap(dict(sorted(out.items())))


def structure_str(structure: Mapping[int, Packed]) -> str:
    """A structure in one line: ``dim 0 [q: 4x8 | k: 2x8 | v: 2x8]``; ``""`` when empty."""
    return "; ".join(f"dim {dim} {packed}" for dim, packed in structure.items())


# ---------------------------------------------------------------------------------------
# JSON: {"0": [{"name": "q", "count": 32, "size": 128}, ...]}

_PART_KEYS: Final = frozenset({"name", "count", "size"})
_DIM_RE: Final = re.compile(r"0|[1-9][0-9]?", re.ASCII)


def structure_to_obj(structure: Mapping[int, Packed]) -> dict[str, object]:
    """A structure as JSON data: dims as decimal keys, each a list of parts.

    >>> structure_to_obj({0: Packed([Part("gate", 4), Part("up", 4)])})
    {'0': [{'name': 'gate', 'count': 4, 'size': 1}, {'name': 'up', 'count': 4, 'size': 1}]}
    """
    return {str(dim): packed_to_obj(packed) for dim, packed in as_structure(structure).items()}


def packed_to_obj(packed: Packed) -> list[dict[str, object]]:
    """One dim's parts as JSON data: a list of parts, as a structure holds it."""
    return [part_to_obj(p) for p in packed.parts]


def part_to_obj(part: Part) -> dict[str, object]:
    """A part as JSON data: ``{"name": "q", "count": 32, "size": 128}``."""
    return {"name": part.name, "count": part.count, "size": part.size}


def _key(path: str, key: str) -> str:
    """``path`` followed down an object's key: ``path["0"]``."""
    return f"{path}[{json.dumps(clip(key))}]" if path else json.dumps(clip(key))


def _field(path: str, name: str) -> str:
    """``path`` followed down a part's field: ``path.count``."""
    return f"{path}.{name}" if path else name


def _bad(path: str, what: str, value: object) -> SerializationError:
    where = path or "$"
    return SerializationError(f"{where}: {what}, got {quote(value)}", path=where)


def structure_from_obj(obj: object, path: str = "") -> dict[int, Packed]:
    """A structure read back from ``structure_to_obj``'s JSON data.

    >>> structure_from_obj({"1": [{"name": "experts", "count": 8, "size": 1}]})
    {1: Packed(parts=(Part(name='experts', count=8, size=1),))}

    Args:
        obj: the JSON value.
        path: where ``obj`` is in its document, for messages (``params["w"].structure``).

    Raises:
        SerializationError: with the path of the first bad value.
    """
    if type(obj) is not dict:
        raise _bad(path, 'expected a structure: an object of dim to parts ({"0": [...]})', obj)
    out: dict[int, Packed] = {}
    for key, parts in obj.items():
        where = _key(path, key) if isinstance(key, str) else f"{path or '$'}[{quote(key)}]"
        if not isinstance(key, str) or not _DIM_RE.fullmatch(key):
            raise _bad(where, f"keys are dims written in decimal, from 0 to {MAX_NDIM - 1}", key)
        out[int(key)] = packed_from_obj(parts, where)
    return out


def packed_from_obj(obj: object, path: str = "") -> Packed:
    """One dim's ``Packed`` read back from ``packed_to_obj``'s JSON data: a list of parts.

    >>> packed_from_obj([{"name": "gate", "count": 4}, {"name": "up", "count": 4}])
    Packed(parts=(Part(name='gate', count=4, size=1), Part(name='up', count=4, size=1)))

    Raises:
        SerializationError: with the path of the first bad value.
    """
    if type(obj) is not list:
        raise _bad(path, "expected a list of parts", obj)
    if len(obj) > MAX_PARTS:
        where = path or "$"
        msg = f"{where}: a dim has at most {MAX_PARTS:,} parts, got {len(obj):,}; check the list"
        raise SerializationError(msg, path=where)
    read = [part_from_obj(item, f"{path}[{i}]") for i, item in enumerate(obj)]
    try:
        return Packed(read)
    except LayoutError as e:
        raise SerializationError(f"{path or '$'}: {e.message}", path=path or "$") from None


def part_from_obj(item: object, path: str = "") -> Part:
    """A ``Part`` read back from ``part_to_obj``'s JSON data: ``name`` a string, ``count``
    and ``size`` ints (never a float, a bool or digits in a string), no other key.

    Raises:
        SerializationError: with the path of the first bad value.
    """
    if type(item) is not dict:
        raise _bad(path, 'expected a part: {"name": ..., "count": ..., "size": ...}', item)
    for key in item:
        if key not in _PART_KEYS:
            raise _bad(path, "a part has the keys name, count and size only", key)
    for key in ("name", "count"):
        if key not in item:
            raise _bad(path, f"a part needs {key!r}", item)
    name, count, size = item["name"], item["count"], item.get("size", 1)
    if not isinstance(name, str):
        raise _bad(_field(path, "name"), "expected a part name (a string)", name)
    for key, n in (("count", count), ("size", size)):
        if type(n) is not int:
            raise _bad(_field(path, key), "expected an int >= 1", n)
    checks: list[tuple[str, Callable[[], Part]]] = [
        ("name", lambda: Part(name, 1)),
        ("count", lambda: Part("part", count)),
        ("size", lambda: Part("part", 1, size)),
        ("", lambda: Part(name, count, size)),
    ]
    for key, build in checks:
        try:
            build()
        except LayoutError as e:
            where = _field(path, key) if key else path
            raise SerializationError(f"{where or '$'}: {e.message}", path=where or "$") from None
    return Part(name, count, size)
