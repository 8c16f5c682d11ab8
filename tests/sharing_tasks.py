"""Job targets of tests/test_sharing.py (module level: jobs import them by reference)."""

from __future__ import annotations

from typing import Any

import numpy as np

table: Any = None


def own_kib() -> int:
    """This process's own anonymous memory, in KiB: the private pages of its anonymous mappings
    (its heap, pages it wrote), not pages of a file it maps (counted as private while it alone
    maps them), nor the heap it shares, unwritten, with the process it was forked from (a
    template that preloaded torch holds a hundred MB of it)."""
    own = 0
    anonymous = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: its range, ..., its path
                fields = line.split()
                anonymous = len(fields) < 6 or fields[5] in ("[heap]", "[stack]") or fields[5].startswith("[anon")
            elif anonymous and head in ("Private_Clean:", "Private_Dirty:"):
                own += int(line.split()[1])
    return own


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
