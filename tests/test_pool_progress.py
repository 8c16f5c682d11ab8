"""Pool progress bars: one argument or one config key shows a tqdm bar that ends at the item count."""

from __future__ import annotations

import io
import re
import sys

import pytest

import fibercore as mp
from tests import pool_tasks as T


def last_count(text: str) -> str:
    """The 'n/total' (or bare 'n') of the bar's last refresh."""
    frames = [f for f in re.split(r"[\r\n]", text) if f.strip()]
    assert frames, f"tqdm wrote nothing: {text!r}"
    match = re.search(r"\|?\s*(\d+(?:/\d+)?)\s*\[", frames[-1]) or re.search(r"(\d+(?:/\d+)?)task", frames[-1])
    assert match, frames[-1]
    return match.group(1)


@pytest.fixture(scope="module")
def pool():
    with mp.Pool(2) as p:
        yield p


def test_map_with_progress_true_counts_every_item(pool):
    buf = io.StringIO()
    assert pool.map(T.square, range(103), chunksize=10, progress={"file": buf}) == [x * x for x in range(103)]
    assert last_count(buf.getvalue()) == "103/103"
    assert "map" in buf.getvalue()


def test_imap_of_a_generator_counts_items_without_a_total(pool):
    buf = io.StringIO()
    out = list(pool.imap((T.square), (x for x in range(57)), chunksize=4, progress={"file": buf, "desc": "gen"}))
    assert out == [x * x for x in range(57)]
    assert last_count(buf.getvalue()) == "57"
    assert "gen" in buf.getvalue()


def test_imap_unordered_and_starmap_bars(pool):
    buf = io.StringIO()
    assert sorted(pool.imap_unordered(T.square, range(40), progress={"file": buf})) == sorted(x * x for x in range(40))
    assert last_count(buf.getvalue()) == "40/40"
    buf = io.StringIO()
    assert pool.starmap(T.add, [(i, i) for i in range(30)], progress={"file": buf}) == [2 * i for i in range(30)]
    assert last_count(buf.getvalue()) == "30/30"


def test_a_failing_chunk_does_not_advance_the_bar(pool):
    """The bar counts tasks that finished (issue 50: it never claims what did not happen): the
    chunk whose task raised (items 6-8) is not counted, the 17 others are, and the bar ends
    there, closed, where it was."""
    buf = io.StringIO()
    with pytest.raises(T.TaskError):
        pool.starmap(T.square_or_raise, [(x, frozenset({7})) for x in range(20)], chunksize=3, progress={"file": buf})
    assert last_count(buf.getvalue()) == "17/20"


def test_a_bar_never_jumps_to_its_end_when_chunks_are_given_up():
    """What terminate() or Ctrl-C gives up comes back as failed chunks: the bar stays at what
    had finished (0 here), is closed once, and says nothing of the rest."""
    from fibercore.pool.progress import Progress
    from fibercore.pool.results import MapResult

    buf = io.StringIO()
    bar = Progress("map", 2000, {"file": buf})
    result = MapResult(250, 2000)
    result._show(bar)
    for index in range(8):
        result._set(index, False, KeyboardInterrupt())
    assert bar._closed and bar._bar.n == 0
    assert "2000/2000" not in buf.getvalue() and "100%" not in buf.getvalue()


def test_with_a_bar_and_no_chunksize_a_map_is_cut_finer_so_the_bar_moves(pool):
    """multiprocessing's default cuts 2,000 tasks on 2 workers into 8 chunks of 250: a bar
    would move 8 times. With a bar the default is 8 times finer; without one, unchanged."""
    seen = []
    buf = io.StringIO()
    assert pool.map(T.square, range(2000), progress={"file": buf}) == [x * x for x in range(2000)]
    from fibercore.pool.results import MapResult

    original = MapResult.__init__

    def spy(self, chunksize, length, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(chunksize)
        original(self, chunksize, length, *args, **kwargs)

    MapResult.__init__ = spy  # type: ignore[method-assign]
    try:
        pool.map(T.square, range(2000), progress={"file": io.StringIO()})
        pool.map(T.square, range(2000))
        with mp.Pool(2, maxtasksperchild=100) as replaced:  # counts chunks: a bar must not add any
            replaced.map(T.square, range(2000), progress={"file": io.StringIO()})
    finally:
        MapResult.__init__ = original  # type: ignore[method-assign]
    assert seen == [32, 250, 250], seen


def test_off_by_default_and_pool_or_config_turn_it_on(fresh_runtime, capsys):
    with mp.Pool(1) as p:
        p.map(T.square, range(5))
    assert "task" not in capsys.readouterr().err
    with mp.Pool(1, progress=True) as p:
        p.map(T.square, range(5))
        p.map(T.square, range(6), progress=False)  # the call's own choice wins
    assert capsys.readouterr().err.count("5/5") >= 1
    mp.init(pool_progress=True)
    with mp.Pool(1) as p:
        p.map(T.square, range(4))
    assert "4/4" in capsys.readouterr().err


def test_without_tqdm_a_plain_counter_shows_progress(pool, monkeypatch, capsys):
    """Getting started's first program runs after `pip install fibercore` alone."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert pool.map(T.square, range(30), chunksize=3, progress=True) == [x * x for x in range(30)]
    err = capsys.readouterr().err
    assert re.fullmatch(r"map: 30/30 tasks \(100%\), [0-9.]+ tasks/s\n", err), repr(err)
    buf = io.StringIO()
    list(pool.imap(T.square, iter(range(5)), progress={"file": buf, "desc": "gen", "unit": "rollout"}))
    assert re.fullmatch(r"gen: 5 rollouts, [0-9.]+ rollouts/s\n", buf.getvalue()), repr(buf.getvalue())


def test_a_bad_progress_value_is_a_type_error(pool):
    with pytest.raises(TypeError, match="progress must be"):
        pool.map(T.square, range(3), progress="yes")


_INTERRUPTED = """
import functools, sys
import fibercore as mp
from tests import pool_tasks as T

if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("started", flush=True)
        pool.map(functools.partial(T.slow_square, seconds=0.05), range(400),
                 progress={"file": sys.stdout, "ncols": 80, "mininterval": 0})
"""


def test_ctrl_c_in_the_middle_of_a_map_leaves_the_bar_where_it_was(tmp_path):
    """SIGINT (Ctrl-C) to a program whose map shows a tqdm bar, once a few tasks finished: the
    program ends by the interrupt, and the bar's last count is what had finished, never the
    total (a false 400/400 was drawn before)."""
    import os
    import select
    import signal
    import subprocess
    import time
    from pathlib import Path

    pytest.importorskip("tqdm")  # the plain counter draws only once, at its end, on a pipe
    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    # Ctrl-C as in a terminal: a runner started in the background (`cmd &`) ignores SIGINT, and
    # the program would inherit that and never see the interrupt (as in test_newcomer).
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    try:
        out = b""
        deadline = time.monotonic() + 90
        while True:  # wait (at most 90 s) for the bar to show some finished tasks
            left = deadline - time.monotonic()
            assert left > 0, f"the bar never moved: {out[-2000:]!r}"
            if select.select([proc.stdout], [], [], min(left, 1.0))[0]:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"the program ended before it was interrupted: {out[-2000:]!r}"
                out += chunk
            counts = [int(c) for c in re.findall(rb"(\d+)/400", out)]
            if counts and max(counts) >= 8:
                break
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err, err[-2000:]
    counts = [int(c) for c in re.findall(rb"(\d+)/400", out + rest)]
    assert counts and max(counts) < 400, (out + rest)[-2000:]
    assert b"100%" not in out + rest
