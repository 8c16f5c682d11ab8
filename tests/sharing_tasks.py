"""Job targets of tests/test_sharing.py (module level: jobs import them by reference)."""

from __future__ import annotations

from typing import Any

import numpy as np

table: Any = None


def own_kib() -> int:
    """This process's anonymous memory, in KiB: what it holds as its own (its heap, pages it
    wrote), not pages of a file it maps (counted as private while it alone maps them)."""
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    raise AssertionError("no Anonymous line in smaps_rollup")


def keep_table(t: Any) -> None:
    global table
    table = t


def read_table(i: int) -> tuple[float, bool, int]:
    """A sum over the whole table (every page read), whether it is writable, its own memory in KiB."""
    return float(table.sum(dtype=np.float64)), bool(table.flags.writeable), own_kib()


def write_table(value: float) -> float:
    """Write the first element (copy-on-write: this worker's own page) and read it back."""
    table[0] = value
    return float(table[0])


def first_element(i: int) -> float:
    return float(table[0])


def try_to_write(handle: Any) -> str:
    array = handle.value
    try:
        array[0] = 42
    except ValueError as exc:
        return f"refused: {exc}"
    return "written"


def one_mapping(handle: Any, again: Any) -> bool:
    """Two handles of one object, received separately, give views of one mapping."""
    return bool(np.shares_memory(handle.value, again.value))


def value_of(handle: Any, out: Any) -> None:
    out.put(handle.value)


def report_value(handle: Any, out: Any) -> None:
    """Put ("ok", the value) or ("error", the exception's type and text) of ``handle.value``."""
    try:
        out.put(("ok", handle.value))
    except Exception as exc:
        out.put(("error", type(exc).__name__, str(exc)))
