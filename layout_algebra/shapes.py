"""Parameter shapes and dtypes, and reading them from safetensors headers.

A ``ParamShape`` is what the lint needs of a parameter besides its layout: its global
shape and its dtype (by torch's name, ``"bfloat16"``), hence its bytes.
``shapes_from_safetensors`` reads them from a ``.safetensors`` file or a sharded
checkpoint's ``model.safetensors.index.json`` without reading any tensor data;
``layout_algebra.torch_bridge.shapes_from_module`` reads them off a live (or meta) model.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import MAX_TENSOR_SIZE, as_shape
from layout_algebra._files import as_path, open_regular
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call
from layout_algebra._text import clip, did_you_mean, quote
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.structure import Packed, as_structure, structure_str

__all__ = [
    "DTYPE_BYTES",
    "ParamShape",
    "shapes_from_safetensors",
]

DTYPE_BYTES: Final[Mapping[str, int]] = FrozenMap(
    {
        "bool": 1,
        "uint8": 1,
        "int8": 1,
        "uint16": 2,
        "int16": 2,
        "uint32": 4,
        "int32": 4,
        "uint64": 8,
        "int64": 8,
        "float8_e4m3fn": 1,
        "float8_e4m3fnuz": 1,
        "float8_e5m2": 1,
        "float8_e5m2fnuz": 1,
        "float8_e8m0fnu": 1,
        "float4_e2m1fn_x2": 1,
        "float16": 2,
        "bfloat16": 2,
        "float32": 4,
        "float64": 8,
        "complex32": 4,
        "complex64": 8,
        "complex128": 16,
    }
)
"""Bytes per element of every dtype, by torch's name (``str(torch.bfloat16)`` less ``torch.``)."""

_SAFETENSORS_DTYPES: Final[Mapping[str, str]] = FrozenMap(
    {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "U16": "uint16",
        "I16": "int16",
        "U32": "uint32",
        "I32": "int32",
        "U64": "uint64",
        "I64": "int64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2": "float8_e5m2",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu",
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "C64": "complex64",
    }
)
"""safetensors' dtype codes, by the torch dtype each one loads as."""

_ALIASES: Final[Mapping[str, str]] = FrozenMap(
    {
        "half": "float16",
        "float": "float32",
        "double": "float64",
        "short": "int16",
        "int": "int32",
        "long": "int64",
        "chalf": "complex32",
        "cfloat": "complex64",
        "cdouble": "complex128",
    }
)
"""torch's other spellings of the same dtypes (``torch.half is torch.float16``)."""

MAX_HEADER_BYTES: Final = 100_000_000
"""A safetensors header is at most this long (the limit the safetensors library enforces)."""

_MAX_SHARDS: Final = 100_000


def as_dtype(value: object) -> str:
    """``value`` as a dtype name of ``DTYPE_BYTES``.

    Takes torch's name (``"bfloat16"``, also ``"torch.bfloat16"`` and torch's aliases
    such as ``"half"``) and safetensors' codes (``"BF16"``).

    Raises:
        LayoutError: not a dtype the package knows.
    """
    if isinstance(value, str):
        name = value.removeprefix("torch.")
        name = _ALIASES.get(name, name)
        name = _SAFETENSORS_DTYPES.get(name, name)
        if name in DTYPE_BYTES:
            return name
    shown = value if isinstance(value, str) else ""
    msg = (
        f"{quote(value)} is not a dtype{did_you_mean(shown, DTYPE_BYTES)}; use torch's name "
        "such as 'bfloat16' or 'float32' (or safetensors' code such as 'BF16')"
    )
    raise LayoutError(msg)


_U64_MAX: Final = 2**64 - 1


def _as_shape(value: Iterable[int]) -> tuple[int, ...]:
    """``value`` as a shape torch can hold: ``as_shape``'s sizes, and an element count
    torch can count (its own rule: the sizes multiplied dim by dim in 64 unsigned bits,
    none overflowing, the count at most 2**63 - 1)."""
    shape = as_shape(value)
    count = 1
    for size in shape:
        count *= size
        if count > _U64_MAX:
            break
    if count > MAX_TENSOR_SIZE:
        msg = (
            f"a shape has at most 2**63 - 1 elements (torch counts them in int64, dim by "
            f"dim), got {quote(shape)}; check the shape"
        )
        raise LayoutError(msg)
    return shape


@checked_call
@attrs.frozen(cache_hash=True, repr=False)
class ParamShape:
    """A parameter's global shape and dtype (torch's name), so also its bytes, and what
    some of its dims are made of.

    A shape torch can hold: at most 64 dims, each size and the element count at most
    2**63 - 1 (torch counts elements in int64). ``structure`` gives, by dim, the parts
    the dim is packed from (``Packed``): heads, fused projections, experts; each one as
    long as its dim.

    >>> p = ParamShape((4096, 1024), "BF16")
    >>> p
    ParamShape(shape=(4096, 1024), dtype='bfloat16')
    >>> p.nbytes
    8388608
    >>> from layout_algebra.structure import Part
    >>> print(ParamShape((1024, 4096), "bfloat16", structure={0: Packed([Part("k", 8, 128)])}))
    bfloat16[1024, 4096] (dim 0 [k: 8x128])
    """

    shape: tuple[int, ...] = attrs.field(converter=_as_shape, **REQUIRED)
    dtype: str = attrs.field(converter=as_dtype, **REQUIRED)
    structure: FrozenMap[int, Packed] = attrs.field(
        default=FrozenMap({}), converter=as_structure, kw_only=True
    )

    def __attrs_pre_init__(
        self, shape: Iterable[int], dtype: str, *, structure: Mapping[int, Packed]
    ) -> None:
        check_init(self, "shape", (shape, dtype, structure))

    @structure.validator
    def _check_structure(
        self, _: attrs.Attribute[FrozenMap[int, Packed]], value: FrozenMap[int, Packed]
    ) -> None:
        for dim, packed in value.items():
            if dim >= self.ndim:
                msg = (
                    f"structure[{dim}] = {packed} is for dim {dim}, but the shape "
                    f"{self.shape} has {self.ndim} dim{'s' if self.ndim != 1 else ''}; "
                    f"give the structure of a dim below {self.ndim}"
                )
                raise LayoutError(msg)
            if packed.length != self.shape[dim]:
                msg = (
                    f"structure[{dim}] = {packed} spans {packed.length} elements, but dim "
                    f"{dim} of the shape {self.shape} has {self.shape[dim]}; give parts "
                    "whose count * size add up to the dim"
                )
                raise LayoutError(msg)

    def with_structure(self, structure: Mapping[int, Packed]) -> ParamShape:
        """This shape with ``structure`` in place of its own (``{}`` drops it)."""
        return attrs.evolve(self, structure=structure)

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """The number of elements."""
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return self.numel * self.itemsize

    def __repr__(self) -> str:
        inner = f"shape={self.shape!r}, dtype={self.dtype!r}"
        if self.structure:
            inner += f", structure={dict(self.structure)!r}"
        return f"ParamShape({inner})"

    def __str__(self) -> str:
        text = f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        return f"{text} ({structure_str(self.structure)})" if self.structure else text


# ---------------------------------------------------------------------------------------
# safetensors headers, read as the safetensors library reads them
#
# The library parses the header with serde_json as {"__metadata__": {str: str} or null,
# NAME: {"dtype", "shape", "data_offsets"}, ...}, then sorts the tensors by their
# data_offsets and requires them to tile the data section exactly: each begins where the
# one before ends, holds its shape times its dtype's bits (whole bytes, counted without
# overflowing 64 bits), and the last ends where the file does. The rules below are those,
# one for one; then each tensor gets the torch dtype and shape torch's loader gives it.

_SAFETENSORS_BITS: Final[Mapping[str, int]] = FrozenMap(
    {
        **{code: DTYPE_BYTES[name] * 8 for code, name in _SAFETENSORS_DTYPES.items()},
        "F4": 4,
        "F6_E2M3": 6,
        "F6_E3M2": 6,
    }
)
"""Bits per element of every dtype code of the safetensors format."""

_SAFETENSORS_CODES: Final[Mapping[str, str]] = FrozenMap(
    {name: code for code, name in _SAFETENSORS_DTYPES.items()}
)
"""The code safetensors writes for each torch dtype it has."""

_FIELDS: Final = ("dtype", "shape", "data_offsets")

_MAX_JSON_DEPTH: Final = 127
"""The deepest nesting of arrays and objects the library's JSON parser reads."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""A lone surrogate: JSON can escape one (``"\\udc80"``), but it is no character."""

_Info: TypeAlias = tuple[str, tuple[int, ...], tuple[int, int]]
"""A tensor's entry as the library reads it: dtype code, shape, data offsets."""


class _Object(list[tuple[str, object]]):
    """A JSON object as its pairs, in order, a repeated key kept: what the format makes of
    a repeated key depends on where it is (a tensor's last entry counts; a second
    ``__metadata__``, or a tensor's field given twice, is refused)."""


def _fail(where: str, what: str) -> SerializationError:
    return SerializationError(f"{where}: {what}", path="$")


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            msg = f"the key {clip(key)!r} appears twice"
            raise ValueError(msg)
        out[key] = value
    return out


def _json_int(text: str) -> int | float:
    """An integer as the library's parser reads it: ``-0`` is a float (no size or offset
    takes one), one of more than 20 digits too, refused beyond a float's range."""
    if text == "-0":
        return -0.0
    if len(text.removeprefix("-")) <= len(str(_U64_MAX)):
        return int(text)
    return _json_float(text)


def _json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        msg = f"the number {clip(text, 40)} is out of range"
        raise ValueError(msg)
    return value


def _json_constant(text: str) -> object:
    msg = f"{text} is not a JSON value"
    raise ValueError(msg)


def _is_u64(value: object) -> bool:
    """A size or an offset of the format: an int from 0 to 2**64 - 1 (a usize)."""
    return type(value) is int and 0 <= value <= _U64_MAX


def _short(value: object) -> bool:
    """A JSON value shown whole inside an array: a number, a short string, null."""
    return not isinstance(value, list | str) or (isinstance(value, str) and len(value) <= 40)


def _what(value: object) -> str:
    """A JSON value of a header for a message, without printing a large one."""
    if isinstance(value, _Object):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        if len(value) <= 8 and all(_short(v) for v in value):
            return quote(value)
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    return quote(value)


def _check_json(where: str, doc: object) -> None:
    """``doc`` is JSON the library's parser reads: nested at most ``_MAX_JSON_DEPTH``
    deep, no lone surrogate in any string."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, list):
            if depth > _MAX_JSON_DEPTH:
                msg = f"the header nests arrays and objects more than {_MAX_JSON_DEPTH} deep"
                raise _fail(where, f"{msg}, more than safetensors reads")
            if isinstance(value, _Object):
                for key, item in value:
                    stack.append((key, depth))
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and _SURROGATE.search(value):
            shown = quote(value)
            raise _fail(where, f"the header holds {shown}, a lone surrogate, which is no text")


def _read_header(path: Path) -> tuple[_Object, int]:
    """The JSON header of one safetensors file, read with bounded reads only, and the
    number of bytes after it (the data section)."""
    where = clip(str(path))
    try:
        with open_regular(str(path)) as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _fail(
                    where,
                    f"{len(prefix)} bytes: not a safetensors file (it starts "
                    "with an 8-byte header length)",
                )
            length = int.from_bytes(prefix, "little")
            if length > MAX_HEADER_BYTES:
                raise _fail(
                    where,
                    f"header length {length} exceeds the {MAX_HEADER_BYTES} "
                    "bytes safetensors allows: not a safetensors file, or a corrupt one",
                )
            if 8 + length > size:
                raise _fail(
                    where,
                    f"header length {length} but the file has {size} bytes: "
                    "truncated or not a safetensors file",
                )
            raw = f.read(length)
    except OSError as e:
        raise _fail(where, f"cannot be read ({e.strerror or e}); check the path") from e
    try:
        doc: object = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_Object,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_json_constant,
        )
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _fail(where, f"the header is not JSON ({clip(str(e))})") from e
    _check_json(where, doc)
    if not isinstance(doc, _Object):
        raise _fail(where, f"the header is a JSON {type(doc).__name__}, not an object")
    return doc, size - 8 - length


def _header_tensors(where: str, doc: _Object) -> dict[str, _Info]:
    """Every tensor's entry by name (a name given twice: its last entry, as the library
    keeps it), ``__metadata__`` checked and set aside."""
    tensors: dict[str, _Info] = {}
    metadata = False
    for name, raw in doc:
        if name != "__metadata__":
            tensors[name] = _tensor_info(f"{where}: tensor {quote(name)}", raw)
            continue
        if metadata:
            raise _fail(where, "'__metadata__' appears twice")
        metadata = True
        _check_metadata(where, raw)
    return tensors


def _check_metadata(where: str, raw: object) -> None:
    """``__metadata__`` is null or an object of strings, as the library reads it."""
    if raw is None:
        return
    if isinstance(raw, _Object):
        bad = next(((key, value) for key, value in raw if not isinstance(value, str)), None)
        if bad is None:
            return
        what = f"{_what(bad[1])} at {quote(bad[0])}"
    else:
        what = _what(raw)
    raise _fail(
        where,
        f"'__metadata__' holds {what}; safetensors reads an object of strings (or null) there",
    )


def _tensor_info(at: str, raw: object) -> _Info:
    if isinstance(raw, _Object):
        fields: dict[str, object] = {}
        for key, value in raw:  # other keys are ignored, as the library ignores them
            if key in _FIELDS:
                if key in fields:
                    raise _fail(at, f"its entry gives {key!r} twice")
                fields[key] = value
        for key in _FIELDS:
            if key not in fields:
                raise _fail(at, f"its entry has no {key!r}")
        dtype, shape, offsets = (fields[key] for key in _FIELDS)
    elif isinstance(raw, list) and len(raw) == len(_FIELDS):  # the library reads this too
        dtype, shape, offsets = raw
    else:
        raise _fail(at, f"its entry is {_what(raw)}, not an object with dtype, shape, data_offsets")
    code = _dtype_code(at, dtype)
    if isinstance(shape, _Object) or not (
        isinstance(shape, list) and all(_is_u64(n) for n in shape)
    ):
        raise _fail(at, f"shape {_what(shape)} is not an array of sizes from 0 to 2**64 - 1")
    if (
        isinstance(offsets, _Object)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_u64(o) for o in offsets)
    ):
        raise _fail(
            at, f"data_offsets {_what(offsets)} is not [begin, end] of ints from 0 to 2**64 - 1"
        )
    return code, tuple(shape), (offsets[0], offsets[1])


def _dtype_code(at: str, raw: object) -> str:
    """The dtype code of a tensor's entry: a code such as ``"BF16"`` (or, as the library
    also reads it, ``{"BF16": null}``)."""
    code = raw
    if isinstance(raw, _Object) and len(raw) == 1 and raw[0][1] is None:
        code = raw[0][0]
    if isinstance(code, str) and code in _SAFETENSORS_BITS:
        return code
    hint = ""
    if isinstance(code, str):
        name = code.removeprefix("torch.")
        name = _ALIASES.get(name, name)
        if name in _SAFETENSORS_CODES:
            hint = f" (safetensors writes {name} as {_SAFETENSORS_CODES[name]!r})"
        else:
            hint = did_you_mean(code, _SAFETENSORS_BITS)
    raise _fail(
        at,
        f"dtype {_what(code)} is not a safetensors dtype code{hint}; the format spells "
        "them 'BF16', 'F32', 'I64' and so on",
    )


def _tile(where: str, tensors: Mapping[str, _Info], data_bytes: int) -> None:
    """The library's rule for the data section: the tensors, in the order of their
    offsets, tile it from byte 0 to its end, each holding exactly its elements' bytes."""
    start = 0
    for name, (code, shape, (begin, end)) in sorted(tensors.items(), key=lambda t: t[1][2]):
        at = f"{where}: tensor {quote(name)}"
        if end < begin:
            raise _fail(at, f"data_offsets [{begin}, {end}] end before they begin")
        if begin != start:
            where_from = "after a gap" if begin > start else "inside the data before it"
            raise _fail(
                at,
                f"its data begins at byte {begin}, {where_from} (which ends at byte "
                f"{start}); tensors' data is contiguous: a corrupt header",
            )
        start = end
        count = 1
        for size in shape:
            count *= size
            if count > _U64_MAX:
                break
        bits = count * _SAFETENSORS_BITS[code]
        if bits > _U64_MAX:
            raise _fail(at, f"shape {_what(list(shape))} of {code} overflows 64 bits")
        if bits % 8:
            raise _fail(at, f"{count} elements of {code} are {bits} bits, not whole bytes")
        if end - begin != bits // 8:
            raise _fail(
                at,
                f"{end - begin} bytes of data for {code}{list(shape)} ({bits // 8} bytes): "
                "a corrupt header",
            )
    if start > data_bytes:
        raise _fail(
            where,
            f"the tensors' data ends at byte {start} of a {data_bytes}-byte data section: "
            "the file is truncated",
        )
    if start < data_bytes:
        raise _fail(
            where,
            f"the tensors' data ends at byte {start} of a {data_bytes}-byte data section: "
            f"{data_bytes - start} bytes no tensor holds, a corrupt file",
        )


def _param_shape(at: str, code: str, shape: tuple[int, ...]) -> ParamShape:
    """A tensor as torch's loader reads it: F4 as float4_e2m1fn_x2, two values a byte
    (the last dim halved); the F6 dtypes, which torch lacks, refused."""
    if code == "F4":
        if not shape or shape[-1] % 2:
            msg = f"F4{list(shape)} packs two values a byte in torch: its last dim is even"
            raise _fail(at, msg)
        dtype = "float4_e2m1fn_x2"
        shape = (*shape[:-1], shape[-1] // 2)
    elif code in _SAFETENSORS_DTYPES:
        dtype = _SAFETENSORS_DTYPES[code]
    else:
        raise _fail(at, f"torch has no dtype for {code}; the file cannot be loaded by torch")
    try:
        return ParamShape(shape, dtype)
    except LayoutError as e:
        raise _fail(at, e.message) from e


def _file_shapes(path: Path) -> dict[str, ParamShape]:
    where = clip(str(path))
    doc, data_bytes = _read_header(path)
    tensors = _header_tensors(where, doc)
    _tile(where, tensors, data_bytes)
    return {
        name: _param_shape(f"{where}: tensor {quote(name)}", code, shape)
        for name, (code, shape, _) in tensors.items()
    }


def _shard_name(where: str, name: str, file: object) -> str:
    """``file``, the shard ``weight_map`` places ``name`` in, as a file name beside the index."""
    if (
        isinstance(file, str)
        and "\0" not in file
        and _SURROGATE.search(file) is None
        and Path(file).name == file
        and file not in {"", ".", ".."}
    ):
        try:
            os.fsencode(file)
        except UnicodeEncodeError:
            pass
        else:
            return file
    raise _fail(
        where,
        f"weight_map[{clip(name)!r}] = {quote(file)} is not a file name "
        "beside the index (shards live in the index's directory)",
    )


def _index_shapes(path: Path) -> dict[str, ParamShape]:
    where = clip(str(path))
    try:
        with open_regular(str(path)) as f:
            raw = f.read(MAX_HEADER_BYTES + 1)
    except OSError as e:
        raise _fail(where, f"cannot be read ({e.strerror or e}); check the path") from e
    if len(raw) > MAX_HEADER_BYTES:
        raise _fail(where, f"more than {MAX_HEADER_BYTES} bytes: not a safetensors index")
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(where, f"not JSON ({clip(str(e))})") from e
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise _fail(
            where,
            "no 'weight_map' object: not a safetensors index (it maps each "
            "tensor name to its shard file)",
        )
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        files.setdefault(_shard_name(where, name, file), []).append(name)
    if len(files) > _MAX_SHARDS:
        raise _fail(where, f"{len(files)} shard files: more than {_MAX_SHARDS}")
    found: dict[str, ParamShape] = {}
    for file, names in files.items():
        shard = _file_shapes(path.parent / file)
        missing = [n for n in names if n not in shard]
        if missing:
            raise _fail(
                where,
                f"{clip(file)!r} has no tensor {clip(missing[0])!r} that "
                f"weight_map places there ({len(missing)} missing); the checkpoint "
                "is incomplete",
            )
        stray = [n for n in shard if weight_map.get(n) != file]
        if stray:
            raise _fail(
                where,
                f"{clip(file)!r} holds {clip(stray[0])!r}, which weight_map "
                "does not place there; the index and its shards disagree",
            )
        found.update(shard)
    return {name: found[name] for name in weight_map}


def shapes_from_safetensors(path: str | os.PathLike[str]) -> Mapping[str, ParamShape]:
    """The shape and dtype of every tensor of a safetensors checkpoint, by name.

    ``path`` is a ``.safetensors`` file or a sharded checkpoint's index (a ``.json`` such
    as ``model.safetensors.index.json``, whose ``weight_map`` names the shard files beside
    it). Only headers are read, never tensor data.

    The header is read here rather than with the ``safetensors`` package: its format is
    small and documented (an 8-byte little-endian length, then that many bytes of JSON
    mapping each tensor name to its ``dtype``, ``shape`` and ``data_offsets``), reading it
    needs no native extension nor any tensor framework, and every read is bounded. It is
    read by the library's own rules: what the library refuses (tensors whose data
    overlaps, leaves gaps or does not cover the file; a ``__metadata__`` value that is
    not a string; a dtype that is not one of its codes such as ``"BF16"``) is an error
    here, and what it reads is read here with the names, shapes and dtypes torch's
    loader gives (``"F4"`` as ``float4_e2m1fn_x2``, two values a byte). Beyond the
    library, a tensor torch cannot hold (more than 64 dims, a size or an element count
    beyond int64, a dtype torch lacks) is an error too.

    Returns:
        A read-only mapping from tensor name to ``ParamShape``, in the file's (or the
        index's) order.

    Raises:
        LayoutError: ``path`` is not a path (naming it).
        SerializationError: a file that cannot be read or is not a regular file, is not
            safetensors, is truncated or corrupt; an index whose shards disagree with it.
    """
    p = Path(as_path(path, "path"))
    shapes = _index_shapes(p) if p.suffix == ".json" else _file_shapes(p)
    return FrozenMap(shapes)


_NUMBER: Final = re.compile(r"\.([0-9]+)(?=\.)")


def _numbers(name: str) -> tuple[str, ...]:
    return tuple(_NUMBER.findall(name))


def fused_experts(fqns: Iterable[str], shapes: Mapping[str, object]) -> dict[str, list[str]]:
    """Each of ``fqns`` the shapes lack whose module the shapes hold one expert at a time,
    with those keys: ``layers.0.mlp.experts.gate_up_proj`` beside
    ``layers.0.mlp.experts.0.gate_proj.weight`` (or ``layers.0.block_sparse_moe.experts.0.w1``:
    a module of the same name, in the same layer), a transformers checkpoint's headers,
    whose loading fuses the experts."""
    numbered: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for raw in shapes:
        key: object = raw  # user input, whatever the annotation says
        if not isinstance(key, str):  # a key no FQN spells: reported where it is read
            continue
        for found in _NUMBER.finditer(key):
            module = key[: found.start()]
            numbered.setdefault((module.rpartition(".")[2], _numbers(module)), []).append(key)
    fused: dict[str, list[str]] = {}
    if numbered:
        for fqn in fqns:
            module = fqn.rpartition(".")[0]
            keys = numbered.get((module.rpartition(".")[2], _numbers(module)))
            if keys and fqn not in shapes:
                fused[fqn] = keys
    return fused


def per_expert_message(fqn: str, fused: Mapping[str, list[str]]) -> str:
    """The one message for ``fqn`` of ``fused_experts``: what the shapes hold, what to do."""
    stored = sorted({_NUMBER.sub(".<n>", k) for k in fused[fqn]})
    shown = ", ".join(quote(k) for k in stored[:3])
    return (
        f"{fqn}: the shapes store the experts one by one ({shown}) where the table names "
        f"fused runtime parameters (this one and {len(fused) - 1} more): a transformers "
        "checkpoint's headers, which its loading fuses; use the runtime shapes, "
        "shapes_from_checkpoint(model, path) or shapes_from_module(model) (on the "
        "command line, give --shapes a shapes.json written from them with shapes_to_json)"
    )
