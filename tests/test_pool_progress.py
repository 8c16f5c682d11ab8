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


def test_a_failing_chunk_still_advances_the_bar(pool):
    buf = io.StringIO()
    with pytest.raises(T.TaskError):
        pool.starmap(T.square_or_raise, [(x, frozenset({7})) for x in range(20)], chunksize=3, progress={"file": buf})
    assert last_count(buf.getvalue()) == "20/20"


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
