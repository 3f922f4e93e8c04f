"""Files the package reads: a path argument checked once, a regular file opened without blocking.

``as_path(value, arg)`` turns a path argument (a ``str`` or an ``os.PathLike``) into the
text of a path this system can open, every way it can be wrong (``__fspath__`` raising or
returning a non-path, a NUL, a character the file system cannot encode) a ``LayoutError``
naming the argument.

``open_regular(path)`` is how every reader opens a file: a FIFO, a device or a directory
is refused before anything is read from it. Opening a FIFO for reading waits for a
writer, so the file is opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open
descriptor (no race with a rename) before a byte is read.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, Final

from layout_algebra._text import quote
from layout_algebra.errors import LayoutError

__all__ = ["as_path", "open_regular"]

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

_OPEN_FLAGS: Final = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | os.O_CLOEXEC
)
"""Read-only; never wait for a FIFO's writer, never adopt a terminal."""


def as_path(value: str | os.PathLike[str], arg: str) -> str:
    """``value`` as the text of a path this system can open.

    Raises:
        LayoutError: not a ``str`` or ``os.PathLike``; its ``__fspath__`` raises or gives
            no ``str``; it holds a NUL or a character the file system cannot encode. The
            message names ``arg``.
    """
    raw: object = value
    if not isinstance(raw, str | os.PathLike):
        msg = f"{arg} must be a file path, got {quote(raw)}"
        raise LayoutError(msg)
    try:
        name: object = os.fspath(raw)
    except Exception as e:  # a path object's own __fspath__ failed, or gave no path
        msg = f"{arg} {quote(raw)} gives no path ({quote(e)}); give a str or a pathlib.Path"
        raise LayoutError(msg) from e
    if not isinstance(name, str):
        msg = f"{arg} must name a file with text, got {quote(name)}"
        raise LayoutError(msg)
    if "\0" in name:
        msg = f"{arg} {quote(name)} holds a NUL character; check the path"
        raise LayoutError(msg)
    try:
        os.fsencode(name)
    except UnicodeEncodeError as e:
        msg = f"{arg} {quote(name)} cannot be a file name on this system ({e.reason}); check it"
        raise LayoutError(msg) from e
    return name


def open_regular(path: str) -> BinaryIO:
    """The regular file at ``path``, open for reading in binary.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (its ``strerror`` says
            what it is: "a FIFO (named pipe), not a regular file").
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
            raise OSError(code, f"{kind}, not a regular file", path)
        os.set_blocking(fd, True)  # O_NONBLOCK was for the open only
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
