"""The optional dependencies: a module that needs one says which extra installs it."""

from __future__ import annotations

import importlib

__all__ = ["require"]


def require(module: str, extra: str, user: str) -> None:
    """Import ``module``, or raise an ImportError naming the extra that installs it.

    Args:
        module: the dependency, e.g. ``"torch"``.
        extra: the package's extra that brings it, e.g. ``"torch"``.
        user: the module that needs it, e.g. ``"layout_algebra.torch_bridge"``.

    Raises:
        ImportError: ``module`` is not installed (``.name`` the missing module).
    """
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        msg = (
            f"{user} needs {module}, which is not installed; install it with "
            f"pip install 'layout_algebra[{extra}]'"
        )
        raise ImportError(msg, name=e.name) from e
