"""Ring: members are jobs, learn rank/size/rendezvous, run torch.distributed; failures end the ring."""

from __future__ import annotations

import os
import time

import pytest

import fibercore as mp
from fibercore.errors import ProcessError
from tests import ring_tasks as R


def test_members_learn_rank_size_and_a_reserved_port():
    out = mp.Queue()
    ring = mp.Ring(3, R.report, initializer=R.keep_out, initargs=(out,))
    ring.run(timeout=120)
    got = sorted(out.get(timeout=30) for _ in range(3))
    assert [(r, s) for r, s, _ in got] == [(0, 3), (1, 3), (2, 3)]
    assert len({port for _, _, port in got}) == 1 and got[0][2] > 0
    assert all(p.exitcode == 0 and p.job is not None for p in ring.members)


def _torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("torch is not installed but CI=true: scripts/test installs torch==2.13.0")
        pytest.skip("torch is not installed (pip install torch==2.13.0)")


def test_gloo_all_reduce_across_4_members():
    _torch()
    out = mp.Queue()
    ring = mp.Ring(4, R.all_reduce, initializer=R.init_gloo, initargs=(out,))
    ring.run(timeout=300)
    got = sorted(out.get(timeout=60) for _ in range(4))
    assert [g[0] for g in got] == [0, 1, 2, 3]
    assert {g[2] for g in got} == {1.0 + 2.0 + 3.0 + 4.0}
    assert len({(g[3], g[4]) for g in got}) == 1


def test_a_dead_member_ends_the_ring_with_an_error_not_a_hang():
    _torch()
    out = mp.Queue()
    ring = mp.Ring(4, R.all_reduce_but_2_dies, initializer=R.init_gloo, initargs=(out,))
    t0 = time.monotonic()
    with pytest.raises(ProcessError, match="Ring member 2 of 4 failed with exit code 3") as info:
        ring.run(timeout=300)
    assert "simulated crash" in str(info.value)
    assert time.monotonic() - t0 < 120
    for p in ring.members:
        assert p.exitcode is not None  # the survivors were stopped


def test_bad_arguments():
    with pytest.raises(ValueError):
        mp.Ring(0, R.report)
    with pytest.raises(TypeError):
        mp.Ring(2, 3)
