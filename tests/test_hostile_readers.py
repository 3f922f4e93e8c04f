"""Hostile files for every reader: safetensors headers against the library, FIFOs, paths.

The safetensors reader is checked against the library itself: real files written by
``safetensors.torch.save_file``, their headers mutated (offsets shifted, overlapping or
leaving gaps, dtype spellings, ``__metadata__`` values, shapes, names, entries given
twice, bytes added or cut), then read by both: the library refuses exactly when the
reader raises a ``LayoutError``, and when both read, they read the same names, shapes and
dtypes (the library's as torch's loader gives them). Every file reader refuses a FIFO at
once instead of waiting for a writer; a path that is no path is a ``LayoutError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    ParamShape,
    SerializationError,
    Shard,
    SourceLayout,
    shapes_from_safetensors,
)
from layout_algebra.cli import main
from layout_algebra.serialization import shapes_to_json, to_json

# ---------------------------------------------------------------------------------------
# the library as the oracle

Triple = tuple[str, tuple[int, ...], str]
"""A tensor as read: name, shape, torch dtype name (``"bfloat16"``)."""

DTYPES: Final = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
)

CODES: Final = (
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
    "F64", "I64", "U64",
)  # fmt: skip
"""Every dtype code the library reads (its error for an unknown one lists them)."""

DTYPE_SPELLINGS: Final = (
    *CODES,
    "bfloat16",
    "float32",
    "torch.float32",
    "half",
    "bf16",
    "f32",
    "F5",
    "",
    {"F32": None},
    {"BF16": None},
    {"F32": 1},
    {"F32": None, "F16": None},
    ["F32"],
    None,
    7,
)

ODD_NUMBERS: Final = (
    0, 1, 2, 3, 4, 8, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, 2.0, True, "2", None,
)  # fmt: skip

METADATA: Final[tuple[object, ...]] = (
    None, {}, {"k": "v"}, {"k": 1}, {"k": None}, {"k": ["v"]}, [], "x", 3,
)  # fmt: skip

NAMES: Final = ("w", "\0data_bytes", "layers.0.attn.wq.weight", "caf\u00e9", "a b", "_")


def library_reads(path: Path) -> set[Triple] | None:
    """What torch's safetensors loader reads of ``path``, or ``None`` when it refuses."""
    try:
        tensors = safetensors.torch.load_file(path)
    except Exception:  # the oracle: whatever the library raises is a refusal
        return None
    return {
        (name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors.items()
    }


def we_read(path: Path) -> set[Triple] | None:
    """What ``shapes_from_safetensors`` reads of ``path``, or ``None`` on a ``LayoutError``."""
    try:
        shapes = shapes_from_safetensors(path)
    except LayoutError:
        return None
    return {(name, p.shape, p.dtype) for name, p in shapes.items()}


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float4_e2m1fn_x2:  # no kernel makes these: a view of bytes
        return torch.zeros(shape, dtype=torch.uint8).view(dtype)
    return torch.zeros(shape, dtype=dtype)


@st.composite
def saved(draw: st.DrawFn) -> tuple[list[tuple[str, object]], bytes]:
    """A real file's header (its pairs, in order) and data section, as the library wrote them."""
    names = draw(st.lists(st.sampled_from(NAMES) | st.text(max_size=4), max_size=4, unique=True))
    tensors = {}
    for name in names:
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        if dtype == torch.float4_e2m1fn_x2 and not shape:
            shape = (1,)  # two 4-bit values a byte: a 0-d tensor has no bytes
        tensors[name] = zeros(shape, dtype)
    metadata = draw(
        st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)
    )
    if not tensors and metadata == {}:
        metadata = None  # the library's writer spells this header wrong
    blob = safetensors.torch.save(tensors, metadata=metadata)
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    return list(header.items()), blob[8 + length :]


TENSOR_MUTATIONS: Final = (
    "offsets", "copy offsets", "dtype", "shape", "name", "twice", "form", "extra", "drop field",
)  # fmt: skip
FILE_MUTATIONS: Final = ("metadata", "add bytes", "cut bytes", "whitespace", "length")


def mutable(pairs: list[tuple[str, object]]) -> list[int]:
    """The tensors of a header whose entries are still whole objects."""
    return [
        i
        for i, (name, entry) in enumerate(pairs)
        if name != "__metadata__"
        and isinstance(entry, dict)
        and {"dtype", "shape", "data_offsets"} <= entry.keys()
        and isinstance(entry["shape"], list)
        and isinstance(entry["data_offsets"], list)
        and len(entry["data_offsets"]) == 2
    ]


def mutate_tensor(
    draw: st.DrawFn, kind: str, pairs: list[tuple[str, object]], i: int
) -> tuple[str, object]:
    """The ``i``-th pair of a header with one mutation of ``kind``."""
    name, entry = pairs[i]
    assert isinstance(entry, dict)
    entry = dict(entry)
    begin, end = entry["data_offsets"]
    if kind == "offsets":
        entry["data_offsets"] = [begin + draw(st.integers(-8, 8)), end + draw(st.integers(-8, 8))]
    elif kind == "copy offsets":
        other = pairs[draw(st.sampled_from(mutable(pairs)))][1]
        assert isinstance(other, dict)
        entry["data_offsets"] = list(other["data_offsets"])
    elif kind == "dtype":
        entry["dtype"] = draw(st.sampled_from(DTYPE_SPELLINGS))
    elif kind == "shape":
        shape = list(entry["shape"])
        number = draw(st.sampled_from(ODD_NUMBERS))
        how = draw(st.sampled_from(["set", "append", "pop", "not a list"]))
        if how == "set" and shape:
            shape[draw(st.integers(0, len(shape) - 1))] = number
        elif how == "append":
            shape.append(number)
        elif how == "pop" and shape:
            shape.pop()
        entry["shape"] = number if how == "not a list" else shape
    elif kind == "name":
        name = draw(st.sampled_from(["\0data_bytes", "__metadata__", *(n for n, _ in pairs)]))
    elif kind == "twice":
        pairs.insert(draw(st.integers(0, len(pairs))), (name, dict(entry)))
    elif kind == "form":  # the library reads a tensor's entry as an array too
        return name, [entry["dtype"], entry["shape"], entry["data_offsets"]]
    elif kind == "extra":
        entry["extra"] = draw(st.sampled_from([1, "x", None, [1, [2]], {"a": -0}]))
    else:
        del entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
    return name, entry


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A saved file with up to four mutations of its header or data."""
    pairs, data = draw(saved())
    around = ""
    length_change = 0
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(TENSOR_MUTATIONS + FILE_MUTATIONS))
        tensors = mutable(pairs)
        if kind in TENSOR_MUTATIONS and tensors:
            i = draw(st.sampled_from(tensors))
            pairs[i] = mutate_tensor(draw, kind, pairs, i)
        elif kind == "metadata":
            pairs = [p for p in pairs if p[0] != "__metadata__"]
            value = draw(st.sampled_from(METADATA))
            pairs.insert(draw(st.integers(0, len(pairs))), ("__metadata__", value))
        elif kind == "add bytes":
            data += b"\0" * draw(st.integers(1, 9))
        elif kind == "cut bytes":
            data = data[: -draw(st.integers(1, 9))]
        elif kind == "whitespace":
            around = draw(st.sampled_from([" ", "\t", "\n", "\x0c", "x"]))
        elif kind == "length":
            length_change = draw(st.integers(-3, 3))
    text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
    header = (around + text + around).encode()
    return struct.pack("<Q", max(0, len(header) + length_change)) + header + data


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile_safetensors") / "model.safetensors"


@settings(max_examples=150)
@given(blob=mutated())
def test_the_reader_reads_what_the_library_reads(scratch: Path, blob: bytes) -> None:
    scratch.write_bytes(blob)
    expected = library_reads(scratch)
    got = we_read(scratch)
    event("the library reads it" if expected is not None else "the library refuses it")
    if expected is None:
        assert got is None, f"the library refuses what the reader reads: {got}"
    else:
        assert got == expected
        assert len(shapes_from_safetensors(scratch)) == len(expected)  # one entry a name


# ---------------------------------------------------------------------------------------
# each class, pinned (each one read wrong before)


def save(path: Path, header: object, data: bytes) -> Path:
    text = header if isinstance(header, str) else json.dumps(header)
    path.write_bytes(struct.pack("<Q", len(text.encode())) + text.encode() + data)
    return path


def entry(
    dtype: object = "F32", shape: Sequence[int] = (2,), offsets: Sequence[int] = (0, 8)
) -> dict[str, object]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def test_a_tensor_named_like_the_readers_bookkeeping_is_read(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"\0data_bytes": torch.zeros(2), "w": torch.zeros(3)}, path)
    assert library_reads(path) == {("\0data_bytes", (2,), "float32"), ("w", (3,), "float32")}
    assert dict(shapes_from_safetensors(path)) == {
        "\0data_bytes": ParamShape((2,), "float32"),
        "w": ParamShape((3,), "float32"),
    }


@pytest.mark.parametrize(
    ("header", "data", "words"),
    [
        ({"a": entry(), "b": entry(offsets=(4, 12))}, 12, "inside the data before it"),
        ({"a": entry(), "b": entry(offsets=(12, 20))}, 20, "after a gap"),
        ({"a": entry(offsets=(4, 12))}, 12, "after a gap"),
        ({"a": entry(), "b": entry()}, 8, "inside the data before it"),
        ({"a": entry()}, 9, "1 bytes no tensor holds"),
        ({"a": entry()}, 7, "the file is truncated"),
        ({}, 1, "1 bytes no tensor holds"),
        ({"__metadata__": {"step": 1}, "a": entry()}, 8, "'__metadata__' holds 1 at 'step'"),
        ({"__metadata__": ["x"], "a": entry()}, 8, "'__metadata__' holds ['x']"),
        ({"a": entry("bfloat16", (2,), (0, 4))}, 4, "safetensors writes bfloat16 as 'BF16'"),
        ({"a": entry("float32")}, 8, "safetensors writes float32 as 'F32'"),
        ({"a": entry("torch.float16", (2,), (0, 4))}, 4, "as 'F16'"),
        ({"a": entry("F6_E2M3", (4,), (0, 3))}, 3, "torch has no dtype for F6_E2M3"),
        ({"a": entry("F4", (2, 3), (0, 3))}, 3, "its last dim is even"),
        ({"a": entry("F4", (3,), (0, 2))}, 2, "12 bits, not whole bytes"),
        ({"a": entry("F32", (2**32, 2**32, 0), (0, 0))}, 0, "overflows 64 bits"),
        ({"a": entry("F32", (0, 2**63), (0, 0))}, 0, "sizes from 0 to 2**63 - 1"),
        ({"a": entry("F32", (1,) * 65, (0, 4))}, 4, "more than 64 dims"),
        ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": NaN}}', 8, "NaN"),
        ('{"a\\ud800": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 8, "surrogate"),
        ('{"a": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 8,
         "'dtype' twice"),
        ('{"a": {"dtype": "F32", "shape": [-0, 2], "data_offsets": [0, 0]}}', 0, "shape [-0.0, 2]"),
        ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1e400}}', 8, "1e400"),
        ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": ' + "[" * 126
         + "]" * 126 + "}}", 8, "more than 127 deep"),
    ],
)  # fmt: skip
def test_what_the_library_refuses_is_a_serialization_error(
    tmp_path: Path, header: object, data: int, words: str
) -> None:
    path = save(tmp_path / "bad.safetensors", header, b"\0" * data)
    assert (
        library_reads(path) is None or "more than 64 dims" in words
    )  # 65 dims: the package's bound
    with pytest.raises(SerializationError) as caught:
        shapes_from_safetensors(path)
    assert words in caught.value.message
    assert str(path) in caught.value.message


@pytest.mark.parametrize(
    ("header", "data"),
    [
        ({"__metadata__": None, "a": entry()}, 8),
        ({"__metadata__": {"k": "v"}, "a": entry({"F32": None})}, 8),
        ({"a": ["F32", [2], [0, 8]]}, 8),
        ({"a": {**entry(), "extra": [1, {"b": None}]}}, 8),
        ({"a": entry("F4", (3, 4), (0, 6))}, 6),
        ({"a": entry("F8_E8M0", (4,), (0, 4))}, 4),
        ({"a": entry("F32", (0, 2**62, 2**62), (0, 0))}, 0),
        ({"a": entry("F32", (1,) * 64, (0, 4))}, 4),
        ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": '
         + json.dumps(entry()) + "}", 8),
        ('{"a\\ud83d\\ude00": ' + json.dumps(entry()) + "}   ", 8),
    ],
)  # fmt: skip
def test_what_the_library_reads_is_read_alike(tmp_path: Path, header: object, data: int) -> None:
    path = save(tmp_path / "odd.safetensors", header, b"\0" * data)
    expected = library_reads(path)
    assert expected is not None
    assert we_read(path) == expected


# ---------------------------------------------------------------------------------------
# FIFOs: refused at once, never waited on


def returns_promptly(call: Callable[[], object], fifos: list[Path]) -> BaseException | None:
    """What ``call`` raised (``None`` if nothing), failing if it waits on a FIFO; a reader
    left waiting is released (a writer opens the FIFO and closes it) so the test ends."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the test
            outcome.append(e)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"waited on a FIFO ({', '.join(map(str, fifos))})")
    return outcome[0]


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_by_the_safetensors_reader(tmp_path: Path) -> None:
    path = fifo(tmp_path / "model.safetensors")
    error = returns_promptly(lambda: shapes_from_safetensors(path), [path])
    assert isinstance(error, SerializationError)
    assert "a FIFO (named pipe), not a regular file" in error.message


def test_an_index_naming_a_fifo_is_refused(tmp_path: Path) -> None:
    shard = fifo(tmp_path / "model-00001.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": shard.name}}))
    error = returns_promptly(lambda: shapes_from_safetensors(index), [shard])
    assert isinstance(error, SerializationError)
    assert "a FIFO" in error.message and shard.name in error.message
    fifo_index = fifo(tmp_path / "fifo.index.json")
    error = returns_promptly(lambda: shapes_from_safetensors(fifo_index), [fifo_index])
    assert isinstance(error, SerializationError) and "a FIFO" in error.message


def test_a_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "model.safetensors"
    directory.mkdir()
    with pytest.raises(SerializationError, match="a directory, not a regular file"):
        shapes_from_safetensors(directory)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    (tmp_path / "t.json").write_text(to_json(table))
    (tmp_path / "s.json").write_text(shapes_to_json({"w": ParamShape((4, 4), "float32")}))
    (tmp_path / "p.json").write_text('{"version": 1, "mesh_axes": ["tp"], "modules": {}}')
    shard = fifo(tmp_path / "shard.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": shard.name}})
    )
    for name in ["FIFO.json", "FIFO.safetensors", "FIFO.txt"]:
        fifo(tmp_path / name)
    return {p.name: str(p) for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "FIFO.json"],
        ["diff", "t.json", "FIFO.json"],
        ["check", "FIFO.json", "--mesh", "tp=2"],
        ["check", "p.json", "--mesh", "tp=2", "--fqns", "FIFO.txt"],
        ["check", "p.json", "--mesh", "tp=2", "--fqns", "FIFO.safetensors"],
        ["draw", "FIFO.json", "w", "--shape", "4", "--mesh", "tp=2"],
        ["lint", "FIFO.json", "--shapes", "s.json", "--mesh", "tp=2"],
        ["lint", "t.json", "--shapes", "FIFO.safetensors", "--mesh", "tp=2"],
        ["lint", "t.json", "--shapes", "FIFO.json", "--mesh", "tp=2"],
        ["lint", "t.json", "--shapes", "model.safetensors.index.json", "--mesh", "tp=2"],
        ["reshard", "t.json", "t.json", "--shapes", "FIFO.safetensors", "--mesh", "tp=2",
         "--to-mesh", "tp=2"],
    ],
    ids=lambda argv: " ".join(argv[:1] + [a for a in argv if "FIFO" in a or "index" in a]),
)  # fmt: skip
def test_every_command_refuses_a_fifo_in_one_line(
    files: dict[str, str], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fifos = [Path(p) for name, p in files.items() if name.startswith(("FIFO", "shard"))]
    codes: list[int] = []
    error = returns_promptly(lambda: codes.append(main([files.get(a, a) for a in argv])), fifos)
    assert error is None
    out, err = capsys.readouterr()
    assert (codes, out) == ([1], "")
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "a FIFO (named pipe), not a regular file" in err


# ---------------------------------------------------------------------------------------
# names that are no file names, paths that are no paths


@pytest.mark.parametrize("shard", ["a\ud800.safetensors", "a\udc80.safetensors"])
def test_an_index_naming_a_lone_surrogate_is_a_serialization_error(
    tmp_path: Path, shard: str, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(SerializationError, match="is not a file name beside the index"):
        shapes_from_safetensors(index)
    table = tmp_path / "t.json"
    table.write_text(to_json(ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})))
    for argv in (
        ["lint", str(table), "--shapes", str(index), "--mesh", "tp=2"],
        ["reshard", str(table), str(table), "--shapes", str(index), "--mesh", "tp=2",
         "--to-mesh", "tp=2"],
    ):  # fmt: skip
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "\\ud800" in err or "\\udc80" in err  # shown escaped


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "a\ud800.json"],
        ["lint", "t.json", "--shapes", "s\ud800.json", "--mesh", "tp=2"],
        ["reshard", "a\ud800.json", "b.json", "--shapes", "s.json", "--mesh", "tp=2",
         "--to-mesh", "tp=2"],
        ["lint", "t.json", "--shapes", "s\ud800.safetensors", "--mesh", "tp=2"],
        ["check", "p\ud800.json", "--mesh", "tp=2"],
    ],
)  # fmt: skip
def test_a_file_name_no_system_holds_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "cannot be a file name" in err, err
    assert "\\ud800" in err  # shown escaped


@pytest.mark.parametrize("command", ["show", "diff"])
def test_a_table_file_changed_after_it_was_written_is_one_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    written = tmp_path / "written.json"
    written.write_text(to_json(table))
    edited = tmp_path / "edited.json"
    edited.write_text(to_json(table).replace('"S(0)"', '"S(1)"'))
    argv = [command, str(edited)] if command == "show" else [command, str(written), str(edited)]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert table.fingerprint() in err and "the file was changed after it was written" in err
    doc = json.loads(edited.read_text())
    del doc["fingerprint"]  # the remedy the message gives
    edited.write_text(json.dumps(doc))
    assert main(argv) == (0 if command == "show" else 1)  # diff: 1 when the tables differ
    out, err = capsys.readouterr()
    assert err == "" and "S(1)" in out


class _PathRaising:
    def __fspath__(self) -> str:
        raise RuntimeError("no path today")


class _PathGiving:
    def __init__(self, value: object) -> None:
        self.value = value

    def __fspath__(self) -> str:
        return self.value  # type: ignore[return-value]  # wrong on purpose


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (_PathRaising(), "gives no path"),
        (_PathGiving(3), "gives no path"),
        (_PathGiving(None), "gives no path"),
        (_PathGiving(b"model.safetensors"), "must name a file with text"),
        (_PathGiving("a\0b.safetensors"), "holds a NUL character"),
        (_PathGiving("a\ud800.safetensors"), "cannot be a file name"),
        (3, "must be a file path"),
        (b"model.safetensors", "must be a file path"),
    ],
)
def test_a_path_that_is_no_path_is_a_layout_error(path: object, words: str) -> None:
    with pytest.raises(LayoutError, match=r"^path ") as caught:
        shapes_from_safetensors(path)  # type: ignore[arg-type]  # wrong on purpose
    assert words in caught.value.message
    assert type(caught.value) is LayoutError


def _fspath_calls() -> Iterator[str]:
    yield "model.safetensors"
    yield "/etc/passwd"


class _Fickle:
    """A path object whose ``__fspath__`` names another file each time it is asked."""

    def __init__(self, root: Path) -> None:
        self.names = (str(root / name) for name in _fspath_calls())

    def __fspath__(self) -> str:
        return next(self.names)


def test_a_path_is_read_once(tmp_path: Path) -> None:
    safetensors.torch.save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    shapes = shapes_from_safetensors(_Fickle(tmp_path))
    assert dict(shapes) == {"w": ParamShape((2,), "float32")}
