"""Robust output: every problem one line on stderr, output written whole or not at all.

A terminal that cannot encode a name, a closed or full stdout and a reader that went
away (``show t.json | head``) each end in one line and an exit status, never in a
traceback or a second failure at the interpreter's last flush.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Final, TextIO

from layout_algebra._text import clip, escape, listed
from layout_algebra.errors import LayoutError, PlanError

__all__ = [
    "MAX_USAGE_CHARS",
    "PROG",
    "Problem",
    "Reported",
    "Usage",
    "deliver",
    "loading",
    "output_encoding",
    "plural",
    "refuse",
    "say",
    "say_error",
    "say_problems",
    "silence_stdout",
    "tolerant",
    "unwritten",
]

PROG: Final = "layout-algebra"
"""The program's name in messages (the console script's name)."""

MAX_USAGE_CHARS: Final = 500
"""The longest usage error shown: argparse quotes the arguments it did not expect."""

_REMEDY: Final = "give the command somewhere to write"
"""What to do about output that cannot be written."""


class Problem(Exception):
    """A layout problem found by the command line itself: exit 1 with this message."""


class Reported(Problem):
    """A layout problem already said on stderr: exit 1."""


class Usage(Problem):
    """A usage error found once the input is read: exit 2 with this message, one line."""


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, in the plural unless ``n`` is 1: ``3 parameters``."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def say_problems(err: TextIO | None, what: str, problems: Sequence[LayoutError]) -> None:
    """The problems of a ``PlanError``, one escaped line each, under ``what``."""
    say(err, f"{PROG}: {what} {plural(len(problems), 'problem')}:")
    for line in listed([escape(problem.message) for problem in problems]):
        say(err, line)


def say_error(err: TextIO | None, error: LayoutError) -> None:
    """A problem the library raised, escaped: one line, or a ``PlanError``'s first line and
    its problems one line each. Only the message's own line breaks are real: one inside a
    problem (an FQN's) is shown escaped, as every control character is."""
    if isinstance(error, PlanError) and error.problems:
        head = error.message.partition("\n")[0]  # "the plan has 3 problems:"
        say(err, f"{PROG}: {escape(head)}")
        for line in listed([escape(problem.message) for problem in error.problems]):
            say(err, line)
        return
    say(err, f"{PROG}: {escape(error.message)}")


def say(stream: TextIO | None, line: str) -> None:
    """One line on ``stream`` (stderr); a stream that cannot take it is left alone."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(line + "\n")
        stream.flush()


@contextlib.contextmanager
def loading(err: TextIO | None, what: str, *, doing: str = "loading") -> Iterator[None]:
    """A line on ``err`` while ``what`` loads (or whatever ``doing`` says), rubbed out once
    it has: only where a person watches (a terminal), so a pipe, a file or a test sees
    nothing."""
    line = f"{PROG}: {doing} {what}..."
    watched = False
    if err is not None:
        with contextlib.suppress(OSError, ValueError):
            watched = err.isatty()
    if watched:
        _say_partial(err, line)
    try:
        yield
    finally:
        if watched:  # back to the start of the line, blanked, for what follows
            _say_partial(err, "\r" + " " * len(line) + "\r")


def _say_partial(stream: TextIO | None, text: str) -> None:
    """``text`` on ``stream`` with no line break; a stream that cannot take it is left alone."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(text)
        stream.flush()


def tolerant(stream: TextIO | None) -> None:
    """Characters the terminal cannot encode are written as ``\\uXXXX``, not refused."""
    if isinstance(stream, io.TextIOWrapper):
        with contextlib.suppress(OSError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def silence_stdout() -> None:
    """Point stdout's descriptor at devnull, so the interpreter's last flush of what could
    not be written does not fail again (after a broken pipe or a full disk)."""
    with contextlib.suppress(OSError, ValueError):
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def unwritten(error: OSError | ValueError) -> str:
    """Stdout silenced after ``error`` failed a write to it, and the message saying so."""
    reason = (error.strerror if isinstance(error, OSError) else None) or str(error)
    silence_stdout()
    return f"cannot write the output: {reason}; {_REMEDY}"


def output_encoding() -> str:
    """The encoding stdout writes in (``""`` when it does not say): the one a table's
    text is formatted for, ``f"{table:{output_encoding()}}"``, so that the FQNs it cannot
    write are escaped before the columns are measured, not after."""
    encoding: object = getattr(sys.stdout, "encoding", None)
    return encoding if isinstance(encoding, str) else ""


def deliver(text: str) -> None:
    """Write the command's output to stdout, all at once.

    Raises:
        Problem: stdout is closed or cannot take the output (a full disk).
        BrokenPipeError: the reader went away (``show t.json | head``).
    """
    if not text:
        return
    out = sys.stdout
    if out is None:
        msg = f"cannot write the output: stdout is closed; {_REMEDY}"
        raise Problem(msg)
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        raise Problem(unwritten(e)) from None


def refuse(err: TextIO | None, problem: Problem, command: str) -> int:
    """Say ``problem`` on ``err`` in one line; its exit status (2 for a usage error)."""
    if isinstance(problem, Usage):  # as argparse's own usage errors read
        prog = f"{PROG} {command}"
        say(err, f"{prog}: {escape(clip(str(problem), MAX_USAGE_CHARS))}; see {prog} --help")
        return 2
    if not isinstance(problem, Reported):
        say(err, f"{PROG}: {escape(str(problem))}")
    return 1
