"""DCP's pickled ``.metadata``, read without running anything from it.

torch writes a checkpoint's metadata with ``pickle``, and a pickle names the callables
that rebuild its objects: the standard reader imports and calls whatever the file names,
so a crafted file runs code as it is read. This reader admits only the names DCP's
metadata is made of (its dataclasses, ``torch.Size``, dtypes, the layout and
memory-format records, the path ``StorageMeta`` keeps) and gives each a stand-in of
this module: a record that keeps the state the file gives, checked field by field by
its reader (``layout_algebra.dcp``). Nothing the file names is imported or called, so
no torch is needed either. Any other name is a ``LayoutError`` naming the file and the
refused ``module.name``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import ClassVar, Final

from layout_algebra._files import open_regular
from layout_algebra._text import clip, human_bytes, quote
from layout_algebra.errors import LayoutError
from layout_algebra.shapes import DTYPE_BYTES

__all__ = [
    "MAX_METADATA_BYTES",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "Dtype",
    "Metadata",
    "MetadataIndex",
    "Record",
    "Size",
    "StorageInfo",
    "TensorProperties",
    "TensorStorageMetadata",
    "load_metadata",
]

MAX_METADATA_BYTES: Final = 1 << 31
"""A ``.metadata`` is read whole, up to this size (far above a 1e5-tensor checkpoint's)."""


class _Missing:
    """No such field in the state the file gives."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final = _Missing()


class Record:
    """One of DCP's dataclasses as a file builds it: the state the file gives, unread.

    A pickle makes such an object with ``cls.__new__(cls)`` and gives it its state with
    ``__setstate__`` (a dict of fields, or ``TensorProperties``' tuple); a crafted file
    may also call the class. Each way only stores what it is given.
    """

    __slots__ = ("args", "state")
    dcp_name: ClassVar[str] = "?"

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = (*args, *kwargs.values())
        self.state: object = None

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<DCP {self.dcp_name}>"

    def field(self, name: str, index: int) -> object:
        """The field ``name`` (position ``index`` in a tuple state), or ``MISSING``."""
        state = getattr(self, "state", None)
        if type(state) is dict:
            return state.get(name, MISSING)
        if type(state) is tuple and index < len(state):
            return state[index]
        args = getattr(self, "args", ())
        return args[index] if index < len(args) else MISSING


class Metadata(Record):
    __slots__ = ()
    dcp_name = "Metadata"


class TensorStorageMetadata(Record):
    __slots__ = ()
    dcp_name = "TensorStorageMetadata"


class BytesStorageMetadata(Record):
    __slots__ = ()
    dcp_name = "BytesStorageMetadata"


class ChunkStorageMetadata(Record):
    __slots__ = ()
    dcp_name = "ChunkStorageMetadata"


class TensorProperties(Record):
    __slots__ = ()
    dcp_name = "TensorProperties"


class MetadataIndex(Record):
    __slots__ = ()
    dcp_name = "MetadataIndex"


class StorageMeta(Record):
    __slots__ = ()
    dcp_name = "StorageMeta"


class StorageInfo(Record):
    __slots__ = ()
    dcp_name = "_StorageInfo"


class _Opaque(Record):
    """A value DCP keeps that this package never reads (a layout, a memory format, a
    path): kept as the arguments the file gives."""

    __slots__ = ()
    dcp_name = "value"


class Size(tuple[object, ...]):
    """``torch.Size`` as a file builds it: the tuple it is given, its items unchecked."""

    __slots__ = ()


class Dtype(str):
    """A torch dtype the file names, by torch's name (``"bfloat16"``)."""

    __slots__ = ()


_DCP: Final = "torch.distributed.checkpoint.metadata"
_RECORDS: Final[tuple[type[Record], ...]] = (
    Metadata,
    TensorStorageMetadata,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    TensorProperties,
    MetadataIndex,
    StorageMeta,
)

_ALLOWED: Final[Mapping[tuple[str, str], object]] = {
    **{(_DCP, r.dcp_name): r for r in _RECORDS},
    # TensorProperties' module before DCP owned it, and its memory-format code
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"): TensorProperties,
    (_DCP, "_MEM_FORMAT_ENCODING"): _Opaque,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): Size,
    ("torch.serialization", "_get_layout"): _Opaque,
    **{("torch", name): Dtype(name) for name in DTYPE_BYTES},
    # StorageMeta.checkpoint_id, a path; an OrderedDict is a dict in its order
    **{("pathlib", name): _Opaque for name in ("PosixPath", "WindowsPath", "PurePosixPath")},
    ("pathlib", "PureWindowsPath"): _Opaque,
    ("collections", "OrderedDict"): dict,
}
"""Every name a ``.metadata`` may use, and the stand-in each one reads as."""


class _Refused(Exception):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(module, name)
        self.what = f"{module}.{name}"


class _Unpickler(pickle.Unpickler):
    """``pickle``'s reader with every global looked up in ``_ALLOWED`` alone."""

    def find_class(self, module: str, name: str) -> object:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _Refused(module, name)
        return found


def load_metadata(path: str) -> object:
    """The object a ``.metadata`` file holds, built from stand-ins only.

    Raises:
        LayoutError: naming ``path``: it cannot be opened or is too large; it names a
            class or function DCP's metadata does not use (nothing of it is run); it is
            no pickle, or a damaged one.
    """
    shown = quote(clip(path))
    try:
        with open_regular(path) as f:
            data = f.read(MAX_METADATA_BYTES + 1)
    except OSError as e:
        msg = f"{shown} cannot be read ({quote(e)}); check the checkpoint directory"
        raise LayoutError(msg) from None
    if len(data) > MAX_METADATA_BYTES:
        msg = (
            f"{shown} is larger than {human_bytes(MAX_METADATA_BYTES)}, more than a "
            "checkpoint's metadata is; check that it is the file dcp.save wrote"
        )
        raise LayoutError(msg)
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except _Refused as e:
        msg = (
            f"{shown} names {quote(clip(e.what))}, which is not one of the classes torch's "
            "checkpoint metadata is made of, so it is refused and nothing in the file was "
            "run; read only the metadata dcp.save wrote"
        )
        raise LayoutError(msg) from None
    except RecursionError:
        msg = f"{shown} nests its objects too deeply to be DCP's metadata; it is refused"
        raise LayoutError(msg) from None
    except Exception as e:  # a truncated or damaged pickle: whatever the reader raises
        msg = f"{shown} could not be read as DCP's metadata ({quote(e)}); it is damaged"
        raise LayoutError(msg) from None
