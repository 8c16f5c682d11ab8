"""A master that leaves (``sys.exit``) while it holds connected Pipes to daemon children and a
Queue, none closed: it must end, with exit code 0. Argument: how many children."""

import sys

import fibercore as mp


def hold(conn):
    conn.send("ready")
    try:
        while True:
            conn.recv()
    except EOFError:
        pass


KEEP = []

if __name__ == "__main__":
    for _ in range(int(sys.argv[1])):
        here, there = mp.Pipe()
        p = mp.Process(target=hold, args=(there,), daemon=True)
        p.start()
        assert here.recv() == "ready"
        KEEP.append((here, there, p))
    q = mp.Queue()
    q.put(1)
    KEEP.append(q)
    print("leaving", flush=True)
    sys.exit(0)
