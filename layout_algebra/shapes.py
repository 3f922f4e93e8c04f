"""Parameter shapes and dtypes, and reading them from safetensors headers.

A ``ParamShape`` is what the lint needs of a parameter besides its layout: its global
shape and its dtype (by torch's name, ``"bfloat16"``), hence its bytes.
``shapes_from_safetensors`` reads them from a ``.safetensors`` file or a sharded
checkpoint's ``model.safetensors.index.json`` without reading any tensor data;
``layout_algebra.torch_bridge.shapes_from_module`` reads them off a live (or meta) model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs

from layout_algebra._args import MAX_NDIM, as_items
from layout_algebra._text import clip, did_you_mean, quote
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.frozen import FrozenMap

__all__ = [
    "DTYPE_BYTES",
    "MAX_HEADER_BYTES",
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


def _as_shape(value: Iterable[int]) -> tuple[int, ...]:
    raw: object = value
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        msg = f"a shape is a sequence of sizes such as (4096, 1024), got {quote(raw)}"
        raise LayoutError(msg)
    shape = as_items(value, "a shape", "(4096, 1024)", limit=MAX_NDIM)  # more are refused
    if len(shape) >= MAX_NDIM:
        got = len(shape) if len(shape) == MAX_NDIM else f"more than {MAX_NDIM}"
        msg = f"a shape has fewer than {MAX_NDIM} dims, got {got}; check the shape"
        raise LayoutError(msg)
    for n in shape:
        if type(n) is not int or n < 0:
            msg = f"a shape holds ints >= 0, got {quote(n)} in {quote(shape)}"
            raise LayoutError(msg)
    return shape


@attrs.frozen(cache_hash=True)
class ParamShape:
    """A parameter's global shape and dtype (torch's name), so also its bytes.

    >>> p = ParamShape((4096, 1024), "BF16")
    >>> p
    ParamShape(shape=(4096, 1024), dtype='bfloat16')
    >>> p.nbytes
    8388608
    """

    shape: tuple[int, ...] = attrs.field(converter=_as_shape)
    dtype: str = attrs.field(converter=as_dtype)

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

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


# ---------------------------------------------------------------------------------------
# safetensors headers


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


def _read_header(path: Path) -> dict[str, object]:
    """The JSON header of one safetensors file, read with bounded reads only."""
    where = clip(str(path))
    try:
        with path.open("rb") as f:
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
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(where, f"the header is not JSON ({clip(str(e))})") from e
    if not isinstance(doc, dict):
        raise _fail(where, f"the header is a JSON {type(doc).__name__}, not an object")
    doc["\0data_bytes"] = size - 8 - length
    return doc


def _tensor(where: str, name: str, raw: object, data_bytes: int) -> ParamShape:
    at = f"{where}: tensor {clip(name)!r}"
    if not isinstance(raw, dict):
        raise _fail(at, f"its entry is {quote(raw)}, not an object with dtype, shape, data_offsets")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in raw:
            raise _fail(at, f"its entry has no {key!r}")
    try:
        shape = ParamShape(raw["shape"], raw["dtype"])
    except LayoutError as e:
        raise _fail(at, e.message) from e
    offsets = raw["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or any(type(o) is not int or o < 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _fail(at, f"data_offsets {quote(offsets)} is not [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    if end > data_bytes:
        raise _fail(
            at,
            f"its data ends at byte {end} of a {data_bytes}-byte data section: "
            "the file is truncated",
        )
    if end - begin != shape.nbytes:
        raise _fail(
            at, f"{end - begin} bytes of data for {shape} ({shape.nbytes} bytes): a corrupt header"
        )
    return shape


def _file_shapes(path: Path) -> dict[str, ParamShape]:
    header = _read_header(path)
    data_bytes = header.pop("\0data_bytes")
    assert isinstance(data_bytes, int)
    header.pop("__metadata__", None)
    where = clip(str(path))
    return {name: _tensor(where, name, raw, data_bytes) for name, raw in header.items()}


def _index_shapes(path: Path) -> dict[str, ParamShape]:
    where = clip(str(path))
    try:
        with path.open("rb") as f:
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
        if (
            not isinstance(file, str)
            or "\0" in file
            or Path(file).name != file
            or file in {"", ".", ".."}
        ):
            raise _fail(
                where,
                f"weight_map[{clip(name)!r}] = {quote(file)} is not a file name "
                "beside the index (shards live in the index's directory)",
            )
        files.setdefault(file, []).append(name)
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
    needs no native extension nor any tensor framework, and this way every read is
    bounded and checked here: the header length against the file size and the
    100 MB limit safetensors itself sets, and each tensor's byte range against its shape,
    dtype and the data present, so a truncated or corrupt file is an error and not a
    wrong shape.

    Returns:
        A read-only mapping from tensor name to ``ParamShape``, in the file's (or the
        index's) order.

    Raises:
        SerializationError: a file that cannot be read, is not safetensors, is truncated
            or corrupt; an index whose shards disagree with it.
    """
    raw: object = path
    if not isinstance(raw, str | os.PathLike):
        msg = f"path must be a file path, got {quote(raw)}"
        raise LayoutError(msg)
    name: object = os.fspath(path)
    if not isinstance(name, str):
        msg = f"path must name a file with text, got {quote(name)}"
        raise LayoutError(msg)
    try:
        os.fsencode(name)
    except UnicodeEncodeError as e:
        msg = f"path {quote(raw)} cannot be a file name on this system ({e.reason}); check the path"
        raise LayoutError(msg) from e
    if "\0" in name:
        msg = f"path {quote(raw)} holds a NUL character; check the path"
        raise LayoutError(msg)
    p = Path(path)
    shapes = _index_shapes(p) if p.suffix == ".json" else _file_shapes(p)
    return FrozenMap(shapes)
