"""An idle program costs nothing: no thread of the master or of its jobs wakes up while a Pool
waits for work, a queue reader waits for an item, a Pipe end waits for a message, or a job
waits for an Event while a manager serves nobody (multiprocessing's idle Pool wakes none
either)."""

from __future__ import annotations

import json
import os

import pytest

from tests.test_dropin import run_script

PROGRAM = """
    import json, os, sys, time
    sys.path.insert(0, {root!r})
    import fibercore as mp
    from tests.helpers import drain, pipe_collect, wait_for_event

    def switches(pids):
        found = {{}}
        for role, pid in pids:
            for tid in os.listdir(f"/proc/{{pid}}/task"):
                try:
                    with open(f"/proc/{{pid}}/task/{{tid}}/status") as fh:
                        text = fh.read()
                    with open(f"/proc/{{pid}}/task/{{tid}}/comm") as fh:
                        name = fh.read().strip()
                except OSError:
                    continue
                key = f"{{role}} {{pid}}/{{tid}} {{name}}"
                found[key] = int(text.split("voluntary_ctxt_switches:")[1].split()[0])
        return found

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            pool.map(abs, range(8), 1)
            q, out = mp.Queue(), mp.Queue()
            reader = mp.Process(target=drain, args=(q, out))  # waits in q.get()
            reader.start()
            a, b = mp.Pipe()
            collector = mp.Process(target=pipe_collect, args=(b, 1))  # waits in recv()
            collector.start()
            b.close()
            manager = mp.Manager()
            shared, event = manager.dict(), mp.Event()
            waiter = mp.Process(target=wait_for_event, args=(event, shared))  # waits in event.wait()
            waiter.start()
            pids = [("master", os.getpid()), ("reader", reader.pid), ("collector", collector.pid),
                    ("waiter", waiter.pid), ("manager", manager._process.pid),
                    *(("worker", w.pid) for w in pool.workers())]
            # Settled: wait for a second in which nothing but this thread's own sleep woke
            # (on a busy machine the start takes longer; a thread that wakes on a timer never
            # settles, and the 4 s below then show it).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                start = switches(pids)
                time.sleep(1.0)
                end = switches(pids)
                if sum(end[t] - start[t] for t in end if t in start and end[t] > start[t]) <= 1:
                    break
            before = switches(pids)
            time.sleep(4.0)
            after = switches(pids)
            woke = {{t: after[t] - before[t] for t in after if t in before and after[t] > before[t]}}
            print(json.dumps(woke))
            q.put(None)
            assert out.get(timeout=30) == []
            a.send("one")
            assert a.recv() == ["one"]
            event.set()
            for p in (reader, collector, waiter):
                p.join(30)
            assert shared["waited"] is True
            manager.shutdown()
"""


def test_an_idle_program_wakes_no_thread(tmp_path):
    import fibercore as mp

    if mp.get_runtime().config.get("transport") != "tcp":
        pytest.skip("a property of the built-in transport (fiber-nng's threads look every 0.5 s "
                    "and it has no private connections, so its jobs get heartbeats)")
    out = run_script(tmp_path, PROGRAM.format(root=os.getcwd()), timeout=120)
    assert out.returncode == 0, out.stderr
    woke = json.loads(out.stdout.strip().splitlines()[-1])
    # The measuring thread's own sleep, and nothing else: a settled pool of local workers looks
    # at its jobs once a minute (their connections end with them).
    assert sum(woke.values()) <= 1, f"threads woke while idle (pid/tid: wake-ups in 4 s): {woke}"
