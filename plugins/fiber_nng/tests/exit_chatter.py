"""Jobs whose thread still sends over a Pipe while the job's exit hooks run (a program that
forgets to stop its threads): each must end with exit code 0. Argument: how many jobs."""

import sys
import threading
import time

import fibercore as mp


def chatter(conn):
    def spam():
        while True:
            try:
                conn.send(b"y" * 100)
            except Exception:
                return

    threading.Thread(target=spam, daemon=True).start()
    time.sleep(0.02)


if __name__ == "__main__":
    ends = []
    procs = []
    for _ in range(int(sys.argv[1])):
        here, there = mp.Pipe()
        p = mp.Process(target=chatter, args=(there,))
        p.start()
        procs.append(p)
        ends.append(here)
    codes = []
    for p in procs:
        p.join()
        codes.append(p.exitcode)
    print(codes)
    sys.exit(0 if all(code == 0 for code in codes) else 1)
