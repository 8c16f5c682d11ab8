"""The original fiber's ``fiber.experimental`` names (``Ring``), for programs written for it."""

from __future__ import annotations

from fibercore.ring import Ring

__all__ = ["Ring"]
