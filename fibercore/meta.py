"""``@fibercore.meta(cpu=, memory=, gpu=)``: resources for one function's jobs.

The decorator only annotates the function (``__fiber_meta__``); the Process (or
Pool) that runs it copies the values into its own JobSpec, so they apply to that
process or pool only (the original leaked them into every later pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def meta(*, cpu: float | None = None, memory: int | None = None, gpu: int | None = None,
         mem: int | None = None) -> Callable[[F], F]:
    """Declare the resources a function's job needs: ``cpu`` cores, ``memory`` MiB, ``gpu`` count.

    ``mem`` is the original fiber's spelling of ``memory``.
    """
    if memory is None:
        memory = mem
    for name, value in (("cpu", cpu), ("memory", memory), ("gpu", gpu)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"@fibercore.meta: {name} must be a non-negative number, got {value!r}")
    values = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("gpu", gpu)) if v is not None}

    def decorate(func: F) -> F:
        func.__fiber_meta__ = dict(values)  # type: ignore[attr-defined]
        return func

    return decorate


def get_meta(process: Any) -> dict[str, Any]:
    """Resources set on the Process (a Pool's workers), on its target, its ``run``, or its class."""
    own = getattr(process, "resources", None)
    if own:
        return dict(own)
    for candidate in (getattr(process, "_target", None), type(process).run, type(process)):
        found = getattr(candidate, "__fiber_meta__", None)
        if found:
            return dict(found)
    return {}
