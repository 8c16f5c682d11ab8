# requires: gymnasium numpy
"""SGD of a linear numpy policy on CartPole through a parameter server, in its three modes.

    scripts/run examples/paramserver_cartpole.py                      # 4 workers, 25 rounds each
    scripts/run examples/paramserver_cartpole.py --workers 8 --rounds 40 --straggler 0.05

Each worker is a job (a ``Process``) that loops: ``pull`` the policy, estimate its gradient
from a few mirrored perturbations (each one CartPole episode, as in ES), ``push`` it. The
server applies ``params - lr * gradient``. Run side by side:

* **BSP** (``staleness=0``): a new version once every worker's gradient of the round is in
  (their mean); everyone waits for the slowest;
* **bounded staleness** (``staleness=2``): a worker may run 2 rounds ahead of the slowest;
* **asynchronous** (``staleness=-1``): every gradient is applied as it comes.

One worker is slowed by ``--straggler`` seconds per round (a busy node), which is where the
modes differ: the table shows each mode's wall time, versions published, and the return of
the final policy (mean of 10 episodes).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import fibercore as mp

DIM = 5  # CartPole's 4 observations and a bias


def episode(env: gym.Env, theta: np.ndarray, seed: int) -> float:
    """One episode of the policy ``action = [obs, 1] . theta > 0``; its return."""
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(np.dot(theta[:-1], obs) + theta[-1] > 0))
        total += float(reward)
        done = terminated or truncated
    return total


def gradient(env: gym.Env, theta: np.ndarray, rng: np.random.Generator, pairs: int, sigma: float) -> np.ndarray:
    """An ES estimate of minus the return's gradient (the server descends it), from centred
    ranks of the mirrored returns (their scale does not matter, only their order)."""
    eps = rng.standard_normal((pairs, theta.size)).astype(theta.dtype)
    returns = np.empty((pairs, 2), dtype=np.float32)
    for k in range(pairs):
        seed = int(rng.integers(1 << 30))
        returns[k] = episode(env, theta + sigma * eps[k], seed), episode(env, theta - sigma * eps[k], seed)
    ranks = np.empty(returns.size, dtype=np.float32)
    ranks[returns.ravel().argsort()] = np.arange(returns.size, dtype=np.float32)
    ranks = (ranks / (returns.size - 1) - 0.5).reshape(returns.shape)
    return -((ranks[:, 0] - ranks[:, 1]) @ eps) / (pairs * sigma)


def worker(ps: mp.ParameterServer, wid: int, rounds: int, pairs: int, sigma: float, delay: float) -> None:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(1000 + wid)
    for _ in range(rounds):
        params, _version = ps.pull()
        time.sleep(delay)
        ps.push({"theta": gradient(env, params["theta"], rng, pairs, sigma)})


def run(staleness: int, workers: int, rounds: int, pairs: int, sigma: float, lr: float,
        straggler: float) -> tuple[float, int, float]:
    """One mode: (wall seconds, versions published, return of the final policy)."""
    ps = mp.ParameterServer({"theta": np.zeros(DIM, dtype=np.float32)}, staleness=staleness, lr=lr,
                            workers=workers)
    started = time.perf_counter()
    jobs = [mp.Process(target=worker, args=(ps, i, rounds, pairs, sigma, straggler if i == 0 else 0.0))
            for i in range(workers)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    if any(job.exitcode for job in jobs):
        raise SystemExit(f"a worker failed: exit codes {[job.exitcode for job in jobs]}")
    wall = time.perf_counter() - started
    params, version = ps.params()
    env = gym.make("CartPole-v1")
    final = float(np.mean([episode(env, params["theta"], 10_000 + k) for k in range(10)]))
    return wall, version, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=25, help="rounds per worker")
    parser.add_argument("--pairs", type=int, default=4, help="mirrored perturbations per gradient")
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--straggler", type=float, default=0.05, help="seconds worker 0 waits each round")
    args = parser.parse_args()
    env = gym.make("CartPole-v1")
    start = float(np.mean([episode(env, np.zeros(DIM, dtype=np.float32), 10_000 + k) for k in range(10)]))
    print(f"initial policy return: {start:.1f}")
    print(f"{'mode':<22} {'wall s':>7} {'versions':>9} {'final return':>13}")
    for name, staleness in (("BSP (staleness=0)", 0), ("bounded (staleness=2)", 2), ("async (staleness=-1)", -1)):
        wall, versions, final = run(staleness, args.workers, args.rounds, args.pairs, args.sigma, args.lr,
                                    args.straggler)
        print(f"{name:<22} {wall:>7.2f} {versions:>9d} {final:>13.1f}")


if __name__ == "__main__":
    main()
