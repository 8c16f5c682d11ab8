"""The serializer protocol, and the two helpers the core uses around it.

A serializer turns an object into a list of buffers (the first is the pickle
stream; the rest are pickle protocol 5 out-of-band buffers, e.g. a numpy array's
memory, which are never copied into the pickle stream) and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from fibercore.errors import SerializationError

Buffer = bytes | bytearray | memoryview


@runtime_checkable
class Serializer(Protocol):
    name: str

    def dumps(self, obj: Any) -> list[Buffer]:
        """Serialize ``obj`` into one or more buffers. Raise on unpicklable objects."""

    def loads(self, parts: Sequence[Buffer]) -> Any:
        """Rebuild an object from the buffers ``dumps`` produced."""


def describe(obj: Any, limit: int = 120) -> str:
    """A short, safe description of ``obj`` for error messages."""
    try:
        text = repr(obj)
    except Exception:  # pragma: no cover - repr itself failed
        text = f"<{type(obj).__qualname__} object>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} (type {type(obj).__module__}.{type(obj).__qualname__})"


def dumps_or_explain(serializer: Serializer, obj: Any, what: str) -> list[Buffer]:
    """Serialize ``obj``; on failure raise a SerializationError naming ``what`` and the object."""
    try:
        return serializer.dumps(obj)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(
            f"cannot send {what} to another process: {describe(obj)} could not be "
            f"pickled ({type(exc).__name__}: {exc}). Objects that hold OS resources "
            "(open files, locks, sockets, generators) cannot cross processes; create "
            "them inside the target function instead, or pass what is needed to rebuild them."
        ) from exc
