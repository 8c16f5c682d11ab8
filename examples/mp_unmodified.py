# requires: nothing beyond fibercore
"""A plain multiprocessing program; the only changed line is the import (the comment above is
what scripts/run reads: what the program needs).

    scripts/run examples/mp_unmodified.py
    FIBER_BACKEND=docker scripts/run examples/mp_unmodified.py

Written for the standard library (Process, Queue, Pool, Lock, Value, Manager, Pipe, Event),
then ``import multiprocessing`` became ``import fibercore as multiprocessing``. Its output is
the same either way; tests/test_examples.py runs both and compares them.
"""

import fibercore as multiprocessing  # was: import multiprocessing


def square(x):
    return x * x


def producer(q, n):
    for i in range(n):
        q.put(i)
    q.put(None)


def add_many(counter, lock, n):
    for _ in range(n):
        with lock:
            counter.value += 1


def fill(shared, key, value):
    shared[key] = value


def echo(conn):
    msg = conn.recv()
    conn.send(msg.upper())
    conn.close()


def wait_then_report(event, q):
    event.wait()
    q.put("released")


def main():
    q = multiprocessing.Queue()
    p = multiprocessing.Process(target=producer, args=(q, 5))
    p.start()
    items = []
    while (item := q.get()) is not None:
        items.append(item)
    p.join()
    print("queue:", items, "exitcode", p.exitcode)

    with multiprocessing.Pool(3) as pool:
        print("pool.map:", pool.map(square, range(10)))
        print("pool.imap:", list(pool.imap(square, range(5))))
        print("apply_async:", pool.apply_async(square, (12,)).get(timeout=60))

    counter, lock = multiprocessing.Value("i", 0), multiprocessing.Lock()
    workers = [multiprocessing.Process(target=add_many, args=(counter, lock, 200)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print("counter:", counter.value)

    with multiprocessing.Manager() as manager:
        shared = manager.dict()
        jobs = [multiprocessing.Process(target=fill, args=(shared, k, k * 10)) for k in range(3)]
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        print("manager dict:", dict(sorted(shared.items())))

    parent, child = multiprocessing.Pipe()
    p = multiprocessing.Process(target=echo, args=(child,))
    p.start()
    parent.send("hello")
    print("pipe:", parent.recv())
    p.join()

    event, out = multiprocessing.Event(), multiprocessing.Queue()
    p = multiprocessing.Process(target=wait_then_report, args=(event, out))
    p.start()
    event.set()
    print("event:", out.get(timeout=60))
    p.join()
    print("cpu_count > 0:", multiprocessing.cpu_count() > 0)


if __name__ == "__main__":
    main()
