"""multiprocessing programs as users write them: each test is a way a drop-in broke.

Programs whose ``__main__`` matters run as real scripts in a subprocess (with a
deadline: a hang is a failure, not a stuck suite).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp


def run_script(tmp_path: Path, source: str, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a main script; fail (not hang) if it does not end in ``timeout``."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=timeout, cwd=tmp_path, **kw)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the program did not end within {timeout} s; its output:\n"
                             f"{exc.stdout}\n{exc.stderr}") from None


@pytest.fixture(scope="module")
def pool():
    p = mp.Pool(2)
    yield p
    p.terminate()


# -- a function that holds numpy arrays (out-of-band buffers in its pickle) ------------------
SIZES = st.lists(st.sampled_from([0, 8, 600, 2048, 70_000]), max_size=6)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=SIZES)
def test_functions_holding_arrays_run_in_pool(pool, sizes):
    """0, 1 or many out-of-band buffers in the function's pickle (arrays ≥ 4 KiB go out of band)."""
    arrays = [np.arange(float(n)) for n in sizes]

    def f(x):
        return x + sum(float(a.sum()) for a in arrays)

    expected = [f(x) for x in range(7)]
    assert pool.map(f, range(7)) == expected
    assert list(pool.imap(f, range(3))) == expected[:3]
    assert pool.apply(f, (4,)) == expected[4]


def test_main_function_over_numpy_array(tmp_path):
    out = run_script(tmp_path, """
        import numpy as np
        import fibercore as mp
        W = np.arange(2048.0)
        def f(x):
            return W[x]
        if __name__ == "__main__":
            with mp.Pool(2) as p:
                print(p.map(f, range(5)))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[np.float64(0.0), np.float64(1.0), np.float64(2.0), np.float64(3.0), np.float64(4.0)]"


# -- __main__ globals: initializers, caches, parameters ------------------------------------
def test_initializer_global_and_module_cache_in_main(tmp_path):
    """The most common Pool idiom, with mp's results side by side in the same program."""
    out = run_script(tmp_path, """
        import multiprocessing
        import fibercore
        model = None
        builds = 0
        _cache = {}
        theta = 1
        def init():
            global model
            model = 10
        def task(x):
            return model * x
        def cached(x):
            global builds
            if "env" not in _cache:
                builds += 1
                _cache["env"] = object()
            return builds
        def use_theta(x):
            return theta
        def run(ctx):
            with ctx.Pool(2, initializer=init) as p:
                squares = p.map(task, range(5))
                builds_seen = max(max(p.map(cached, range(4), chunksize=1)) for _ in range(7))
                return squares, builds_seen
        if __name__ == "__main__":
            print(run(multiprocessing.get_context("spawn")))
            print(run(fibercore))
            with fibercore.Pool(2) as p:
                first = p.map(use_theta, range(4))
                theta = 2  # rebound in the master: the workers see the new value
                print(first, p.map(use_theta, range(4)))
    """)
    assert out.returncode == 0, out.stderr
    mp_line, fiber_line, theta_line = out.stdout.strip().splitlines()
    assert fiber_line == mp_line == "([0, 10, 20, 30, 40], 1)"
    assert theta_line == "[1, 1, 1, 1] [2, 2, 2, 2]"
