"""The errors of layout_algebra: one ``LayoutError`` family, each carrying its context.

This module imports nothing from the package so that every other module can raise these
without import loops. Messages are composed where the error is raised (they know the
parameter, the axis and the placement) and always end with what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BindError",
    "LayoutError",
    "OwnedAxisError",
    "PlacementSyntaxError",
    "PlanError",
    "SerializationError",
    "TiedLayoutConflict",
    "UnknownAxisError",
]


class LayoutError(ValueError):
    """A layout, plan or table that cannot be what the caller asked for.

    Attributes:
        fqn: the parameter's fully qualified name, where there is one.
        axis: the mesh axis concerned, where there is one.
        placement: the placement concerned, in DSL form (``"S(0)"``), where there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        fqn: str | None = None,
        axis: str | None = None,
        placement: str | None = None,
    ) -> None:
        super().__init__(message)
        self.fqn = fqn
        self.axis = axis
        self.placement = placement

    @property
    def message(self) -> str:
        """The message the error was raised with."""
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        # The leaves take their context as keyword-only arguments, which the default
        # exception pickling (``cls(*args)``) cannot pass: rebuild from args and state.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[LayoutError], args: tuple[object, ...], state: dict[str, object]
) -> LayoutError:
    """A pickled ``LayoutError`` (any subclass) with its message and context restored."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class PlacementSyntaxError(LayoutError):
    """Text that is not a placement of the DSL.

    Attributes:
        text: the text that did not parse.
    """

    def __init__(self, message: str, *, text: str) -> None:
        super().__init__(message)
        self.text = text


class OwnedAxisError(LayoutError):
    """A non-Replicate placement on an axis whose sharding belongs to FSDP or pipelining."""


class UnknownAxisError(LayoutError):
    """A placement on an axis that neither the mesh nor the run's vocabulary knows (a typo)."""


class TiedLayoutConflict(LayoutError):
    """Parameters that share storage were given layouts that cannot be one layout.

    Attributes:
        group: the FQNs sharing storage, sorted.
        sources: for each conflicting side, the FQN the placement came from.
    """

    def __init__(
        self,
        message: str,
        *,
        group: Sequence[str],
        axis: str | None,
        placements: tuple[str, str],
        sources: tuple[str, str],
    ) -> None:
        super().__init__(message, fqn=sources[0], axis=axis, placement=placements[0])
        self.group = tuple(group)
        self.placements = placements
        self.sources = sources


class PlanError(LayoutError):
    """Every problem found in one plan, raised together so they can be fixed in one go.

    Attributes:
        problems: each problem as its own ``LayoutError``, in plan order.
    """

    def __init__(self, message: str, *, problems: Sequence[LayoutError]) -> None:
        first = problems[0] if problems else None
        super().__init__(
            message,
            fqn=first.fqn if first else None,
            axis=first.axis if first else None,
            placement=first.placement if first else None,
        )
        self.problems: tuple[LayoutError, ...] = tuple(problems)


class SerializationError(LayoutError):
    """A JSON document that is not a valid table or plan.

    Attributes:
        path: where in the document the first bad value is, e.g.
            ``entries["layers.7.w"].placements[0]`` (``$`` for the document itself).
    """

    def __init__(self, message: str, *, path: str, fqn: str | None = None) -> None:
        super().__init__(message, fqn=fqn)
        self.path = path


class BindError(LayoutError):
    """A table that cannot be mapped onto a live module or device mesh."""
