"""Ring member functions (module level: jobs import them by reference)."""

from __future__ import annotations

import os
import time
from typing import Any

_out: Any = None


def init_gloo(out: Any) -> None:
    """The initializer: the environment already names the rendezvous (env://)."""
    global _out
    import torch.distributed as dist

    _out = out
    dist.init_process_group("gloo", init_method="env://")


def all_reduce(rank: int, size: int) -> None:
    import torch
    import torch.distributed as dist

    from fibercore import ring

    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor)
    me = ring.current()
    _out.put((rank, size, float(tensor.item()), me.master_port, os.environ["MASTER_ADDR"]))
    dist.destroy_process_group()


def all_reduce_but_2_dies(rank: int, size: int) -> None:
    import torch
    import torch.distributed as dist

    if rank == 2:
        print("member 2: simulated crash before the collective", flush=True)
        time.sleep(0.5)
        os._exit(3)
    tensor = torch.ones(1)
    dist.all_reduce(tensor)  # blocks: member 2 never joins
    _out.put(rank)


def report(rank: int, size: int) -> None:
    from fibercore import ring

    me = ring.current()
    assert me is not None and (me.rank, me.size) == (rank, size)
    _out.put((rank, size, me.master_port))


def keep_out(out: Any) -> None:
    global _out
    _out = out
