"""What watching a program costs it: the paper's framework-overhead test with nobody looking,
with ``fiber top`` looking, and with the dashboard on and a page polling it every second.

    python bench/bench_dashboard.py --rounds 5

Each variant runs in a fresh process (the dashboard, once on, stays on), interleaved round by
round; the table gives medians and each variant's ratio to "off". multiprocessing (fork) runs
the same test for scale. Workloads: bench_pool's ``overhead`` (5 workers, 5,000 tasks of
1 ms, ideal 1 s) and ``overhead_rounds`` (1,000 rounds of 5 such tasks, ideal 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("off", "watched", "on", "mp")


def _poll_dashboard(stop: threading.Event) -> None:
    """What an open page does: ask for the state once a second."""
    from fibercore import dashboard

    while not stop.is_set() and dashboard.url() is None:
        time.sleep(0.05)
    url = dashboard.url()
    assert url is not None
    base, token = url.split("?token=")
    while not stop.wait(1.0):
        request = urllib.request.Request(base + "api/state", headers={"X-Fiber-Token": token})
        with urllib.request.urlopen(request, timeout=5) as res:
            res.read()


def _watch(stop: threading.Event) -> None:
    """What fiber top does: keep the session's watch file fresh."""
    from fibercore.observe import recorder, status

    while not stop.wait(0.5):
        rec = recorder._recorder
        if rec is not None:
            status.watch(rec.session)


def child(variant: str) -> None:
    sys.path.insert(0, str(HERE))
    import bench_pool

    if variant == "mp":
        import multiprocessing

        lib = multiprocessing.get_context("fork")
    else:
        import fibercore

        lib = fibercore
        if variant == "on":
            fibercore.init(dashboard=True)
    stop = threading.Event()
    helper = {"on": _poll_dashboard, "watched": _watch}.get(variant)
    if helper is not None:
        threading.Thread(target=helper, args=(stop,), daemon=True).start()
    out = {"overhead": bench_pool.overhead(lib, 0.001), "rounds": bench_pool.overhead_rounds(lib, 0.001)}
    stop.set()
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    results: dict[str, dict[str, list[float]]] = {v: {"overhead": [], "rounds": []} for v in VARIANTS}
    env = {**os.environ, "FIBER_DASHBOARD": "0"}
    for r in range(args.rounds):
        for variant in VARIANTS:
            run = subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True,
                                 env=env, timeout=300, check=True)
            got = json.loads(run.stdout.strip().splitlines()[-1])
            for key, value in got.items():
                results[variant][key].append(value)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"`python bench/bench_dashboard.py --rounds {args.rounds}` on {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}; medians, seconds (ideal 1 s); ratio to fibercore with nobody looking.\n")
    print("| test | nobody looking | fiber top looking | dashboard on, page open | multiprocessing (fork) |")
    print("|---|---|---|---|---|")
    for key, title in (("overhead", "5,000 tasks of 1 ms, Pool(5)"), ("rounds", "1,000 rounds of 5 tasks of 1 ms")):
        med = {v: statistics.median(results[v][key]) for v in VARIANTS}
        cells = [f"{med['off']:.3f} s"] + [f"{med[v]:.3f} s ({med[v] / med['off']:.3f}x)" for v in VARIANTS[1:]]
        print(f"| {title} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
