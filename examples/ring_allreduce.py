# requires: torch
"""Distributed averaging with torch.distributed (gloo) on a fibercore Ring.

    pip install torch          # the CPU build is enough
    scripts/run examples/ring_allreduce.py

Each member holds a vector; after an all-reduce every member has the average. The
same program runs its members as containers or pods by changing FIBER_BACKEND.
"""

from __future__ import annotations

import fibercore


def init() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")  # RANK, MASTER_ADDR... are set


def average(rank: int, size: int) -> None:
    import torch
    import torch.distributed as dist

    tensor = torch.full((4,), float(rank))
    dist.all_reduce(tensor)
    tensor /= size
    print(f"member {rank}/{size}: average {tensor.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    fibercore.Ring(4, average, initializer=init).run(timeout=300)
    print("all members done")
