"""Parameter shapes: ``ParamShape``, safetensors headers and live models.

The oracles: files written by the ``safetensors`` package and by transformers'
``save_pretrained`` (a sharded checkpoint with its index), read back here header by
header, against ``shapes_from_module`` of the model they came from.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import pytest
import safetensors.torch
import torch
from torch import nn

from layout_algebra import LayoutError, ParamShape, SerializationError, shapes_from_safetensors
from layout_algebra.errors import BindError
from layout_algebra.serialization import converter, shapes_from_json, shapes_to_json
from layout_algebra.shapes import DTYPE_BYTES, MAX_HEADER_BYTES
from layout_algebra.torch_bridge import shapes_from_module
from tests.models import Sizes, hf_llama, hf_moe

M = TypeVar("M", bound=nn.Module)

# ---------------------------------------------------------------------------------------
# ParamShape


def test_param_shape_reads_as_torch_spells_it() -> None:
    p = ParamShape((4096, 1024), "bfloat16")
    assert repr(p) == "ParamShape(shape=(4096, 1024), dtype='bfloat16')"
    assert str(p) == "bfloat16[4096, 1024]"
    assert (p.ndim, p.numel, p.itemsize, p.nbytes) == (2, 4096 * 1024, 2, 4096 * 1024 * 2)
    assert ParamShape([3], "torch.float32") == ParamShape((3,), "F32") == ParamShape((3,), "float")
    assert ParamShape((), "BOOL").nbytes == 1
    assert hash(ParamShape((2, 2), "half")) == hash(ParamShape((2, 2), "float16"))


def test_every_dtype_has_torchs_itemsize() -> None:
    for name, size in DTYPE_BYTES.items():
        dtype = getattr(torch, name)
        assert isinstance(dtype, torch.dtype)
        assert str(dtype) == f"torch.{name}"
        assert dtype.itemsize == size, name


def test_every_safetensors_dtype_is_torchs() -> None:
    # safetensors' own code -> torch dtype table, the one its torch loader uses
    for code, dtype in safetensors.torch._TYPES.items():
        if dtype is not None:
            assert ParamShape((1,), code).dtype == str(dtype).removeprefix("torch."), code


@pytest.mark.parametrize(
    ("shape", "dtype", "match"),
    [
        ((4, -1), "float32", r"sizes from 0 to 2\*\*63 - 1"),
        ((4, 2.0), "float32", r"sizes from 0 to 2\*\*63 - 1"),
        ((4, True), "float32", r"sizes from 0 to 2\*\*63 - 1"),
        ((0, 10**5000), "float32", r"sizes from 0 to 2\*\*63 - 1 \(int64\), got <an int of"),
        ((0, 2**63), "float32", r"sizes from 0 to 2\*\*63 - 1"),
        ("44", "float32", "a sequence of sizes"),
        (None, "float32", "a sequence of sizes"),
        ((1,) * 65, "float32", "more than 64 dims"),
        ((4,), "bfloat61", "did you mean 'bfloat16'"),
        ((4,), 16, "is not a dtype"),
    ],
)
def test_param_shape_refuses(shape: object, dtype: object, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        ParamShape(shape, dtype)  # type: ignore[arg-type]


def test_param_shape_takes_64_dims() -> None:
    p = ParamShape((1,) * 63 + (3,), "float32")
    assert (p.ndim, p.numel) == (64, 3)
    assert shapes_from_json(shapes_to_json({"w": p})) == {"w": p}


def torch_counts(shape: tuple[int, ...]) -> bool:
    """Whether torch counts the elements of ``shape`` in int64: a reshape of no data
    multiplies the sizes (and says when that overflows), ``torch.Size.numel`` gives the
    int64 count (negative once it passes 2**63 - 1)."""
    try:
        torch.empty(0).reshape(shape)
    except RuntimeError as e:
        if "numel: integer multiplication overflow" in str(e):
            return False
    return torch.Size(shape).numel() >= 0


@pytest.mark.parametrize(
    "shape",
    [
        (2**62, 2**62),
        (2**62, 2),
        (2**62, 4, 0),  # 2**64 overflows before the 0: torch refuses it too
        (2**31, 2**31, 2**31, 0),
        (2**62, 2, 0),  # 2**63 fits 64 unsigned bits: the 0 makes the count 0
        (0, 2**62, 2**62),
        (2**63 - 1,),
        (2**31, 2**31),
    ],
)
def test_param_shape_counts_elements_as_torch_does(shape: tuple[int, ...]) -> None:
    if torch_counts(shape):
        assert ParamShape(shape, "bfloat16").numel == math.prod(shape)
    else:
        with pytest.raises(LayoutError, match=r"at most 2\*\*63 - 1 elements"):
            ParamShape(shape, "bfloat16")


def test_a_huge_shape_is_refused_before_it_is_linted() -> None:
    # once accepted with ~1e37 bytes a rank, and no problem
    with pytest.raises(LayoutError, match="elements"):
        ParamShape((2**62, 2**62), "bfloat16")


class _Broken:
    """A shape whose ``__len__`` and ``__iter__`` raise."""

    def __len__(self) -> int:
        raise RuntimeError("no len")

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("no iter")


def test_a_shape_that_cannot_be_read_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match="a shape could not be read") as caught:
        ParamShape(_Broken(), "float32")
    assert isinstance(caught.value.__cause__, RuntimeError)


# ---------------------------------------------------------------------------------------
# shapes_from_module


def aliases(model: nn.Module) -> list[list[str]]:
    """The groups of FQNs that name one Parameter, as torch lists them."""
    groups: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(fqn)
    return [group for group in groups.values() if len(group) > 1]


def test_shapes_from_module_lists_every_alias() -> None:
    model = hf_moe()  # meta device, LM head tied to the embedding
    shapes = shapes_from_module(model)
    names = [fqn for fqn, _ in model.named_parameters(remove_duplicate=False)]
    assert list(shapes) == names
    for fqn, param in model.named_parameters(remove_duplicate=False):
        assert shapes[fqn].with_structure({}) == ParamShape(tuple(param.shape), str(param.dtype))
    tied = aliases(model)
    assert tied
    for group in tied:
        assert len({shapes[fqn] for fqn in group}) == 1
    experts = [fqn for fqn in shapes if fqn.endswith("experts.gate_up_proj")]
    assert experts
    assert all(shapes[fqn].ndim == 3 for fqn in experts)


def test_shapes_from_module_wants_a_module() -> None:
    with pytest.raises(BindError, match=r"shapes_from_module\(module=...\): must be"):
        shapes_from_module({"w": torch.zeros(2)})  # type: ignore[arg-type]


def test_shapes_from_module_names_a_dtype_it_cannot_size() -> None:
    module = nn.Module()
    module.q = nn.Parameter(torch.zeros(2, dtype=torch.uint8), requires_grad=False)
    module.q.data = module.q.data.view(torch.bits8)
    with pytest.raises(BindError, match=r"^q: 'torch.bits8' is not a dtype") as caught:
        shapes_from_module(module)
    assert caught.value.fqn == "q"


# ---------------------------------------------------------------------------------------
# shapes_from_safetensors against files the safetensors package and transformers wrote


def headers_of(shapes: Mapping[str, ParamShape]) -> dict[str, ParamShape]:
    """``shapes`` as a checkpoint's headers give them: without the model's structure."""
    return {fqn: shape.with_structure({}) for fqn, shape in shapes.items()}


def cpu(model: M, dtype: torch.dtype = torch.float32) -> M:
    """A meta-device transformers model given real (uninitialised) storage on the CPU.

    ``to_empty`` gives every alias its own storage: ``tie_weights`` ties them again.
    """
    model = model.to_empty(device="cpu").to(dtype)
    tie: object = getattr(model, "tie_weights", None)
    assert callable(tie)
    tie()
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_safetensors_file_gives_the_models_shapes(tmp_path: Path, dtype: torch.dtype) -> None:
    model = cpu(hf_llama(), dtype)
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(model.state_dict(), path)
    assert dict(shapes_from_safetensors(path)) == headers_of(shapes_from_module(model))
    assert shapes_from_safetensors(str(path)) == shapes_from_safetensors(path)


def test_a_tied_model_saves_one_alias(tmp_path: Path) -> None:
    model = cpu(hf_moe())
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_model(model, str(path))  # writes one name per shared storage
    from_file = shapes_from_safetensors(path)
    from_module = headers_of(shapes_from_module(model))
    assert {fqn: from_module[fqn] for fqn in from_file} == dict(from_file)
    missing = set(from_module) - set(from_file)
    aliased = {fqn for group in aliases(model) for fqn in group}
    assert missing
    assert missing <= aliased


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    model = cpu(hf_llama(Sizes(layers=2)))
    model.save_pretrained(tmp_path, max_shard_size="8KB", safe_serialization=True)
    index = tmp_path / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    assert len(set(weight_map.values())) >= 2  # really sharded
    shapes = shapes_from_safetensors(index)
    assert list(shapes) == list(weight_map)
    assert dict(shapes) == headers_of(shapes_from_module(model))
    # and the same shapes through shapes.json and the converter
    assert shapes_from_json(shapes_to_json(shapes)) == shapes
    for shape in shapes.values():
        assert converter.structure(converter.unstructure(shape), ParamShape) == shape


def test_only_headers_are_read(tmp_path: Path) -> None:
    # A 1 TiB tensor in a sparse file: reading its data would exhaust the machine.
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [2**19, 2**20], "data_offsets": [0, 2**40]}}
    ).encode()
    path = tmp_path / "huge.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 2**40)
    assert dict(shapes_from_safetensors(path)) == {"w": ParamShape((2**19, 2**20), "bfloat16")}


# ---------------------------------------------------------------------------------------
# hostile files


def write(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def entry(dtype: str = "F32", shape: list[int] | None = None, offsets: object = None) -> object:
    shape = [2, 2] if shape is None else shape
    return {"dtype": dtype, "shape": shape, "data_offsets": [0, 16] if offsets is None else offsets}


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        (b"", b"", None, "0 bytes: not a safetensors file"),
        (b"{}", b"", MAX_HEADER_BYTES + 1, "exceeds the 100000000 bytes"),
        (b"{}", b"", 2**64 - 1, "exceeds the 100000000 bytes"),
        (b'{"w": 1', b"", 100, "truncated or not a safetensors file"),
        (b'{"w": 1', b"", None, "the header is not JSON"),
        (b"\xff\xfe", b"", None, "the header is not JSON"),
        (b"[1, 2]", b"", None, "a JSON list, not an object"),
        (b'{"__metadata__": {}, "__metadata__": {}}', b"", None, "'__metadata__' appears twice"),
        (b'{"w": 3}', b"", None, "tensor 'w': its entry is 3"),
        (b'{"w": {"dtype": "F32", "shape": [1]}}', b"", None, "has no 'data_offsets'"),
        (json.dumps({"w": entry()}).encode(), b"\0" * 8, None, "the file is truncated"),
        (json.dumps({"w": entry(offsets=[0, 12])}).encode(), b"\0" * 16, None, "12 bytes of data"),
        (
            json.dumps({"w": entry(offsets=[8, 0])}).encode(),
            b"\0" * 16,
            None,
            "end before they begin",
        ),
        (json.dumps({"w": entry(offsets="0:16")}).encode(), b"", None, r"is not \[begin, end\]"),
        (
            json.dumps({"w": entry(dtype="F5")}).encode(),
            b"\0" * 16,
            None,
            "'F5' is not a safetensors",
        ),
        (
            json.dumps({"w": entry(shape=[2, -2])}).encode(),
            b"\0" * 16,
            None,
            r"\[2, -2\] is not an",
        ),
        (b"[" * 100_000 + b"]" * 100_000, b"", None, "the header is not JSON"),
    ],
)
def test_a_bad_file_is_a_serialization_error(
    tmp_path: Path, header: bytes, data: bytes, length: int | None, match: str
) -> None:
    path = tmp_path / "bad.safetensors"
    if header or data or length is not None:
        write(path, header, data, length)
    else:
        path.write_bytes(b"")
    with pytest.raises(SerializationError, match=match) as caught:
        shapes_from_safetensors(path)
    assert str(path) in caught.value.message


def test_a_missing_file_is_a_serialization_error(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="cannot be read"):
        shapes_from_safetensors(tmp_path / "nope.safetensors")
    with pytest.raises(LayoutError, match="path must be a file path"):
        shapes_from_safetensors(3)  # type: ignore[arg-type]


def index(tmp_path: Path, weight_map: object) -> Path:
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.parametrize(
    ("weight_map", "match"),
    [
        ({"w": "../secret.safetensors"}, "is not a file name beside the index"),
        ({"w": "/etc/passwd"}, "is not a file name beside the index"),
        ({"w": 7}, "is not a file name beside the index"),
        ({"w": "a\0.safetensors"}, "is not a file name beside the index"),
        ({"w": "a.safetensors", "v": "a.safetensors"}, "has no tensor 'v'"),
        ({}, "holds 'w', which weight_map does not place there"),
        ([], "no 'weight_map' object"),
    ],
)
def test_a_bad_index_is_a_serialization_error(
    tmp_path: Path, weight_map: object, match: str
) -> None:
    write(tmp_path / "a.safetensors", json.dumps({"w": entry()}).encode(), b"\0" * 16)
    if weight_map == {}:
        weight_map = {"u": "b.safetensors"}
        write(
            tmp_path / "b.safetensors",
            json.dumps({"u": entry(), "w": entry(offsets=[16, 32])}).encode(),
            b"\0" * 32,
        )
    with pytest.raises(SerializationError, match=match):
        shapes_from_safetensors(index(tmp_path, weight_map))


def test_an_index_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors.index.json"
    path.write_text("{'weight_map': {}}")
    with pytest.raises(SerializationError, match="not JSON"):
        shapes_from_safetensors(path)
