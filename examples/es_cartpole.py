# requires: gymnasium numpy
# optional: matplotlib (the --plot PNG)
"""Evolution Strategies on gymnasium's CartPole with a job-backed Pool (the paper's ES pattern).

    scripts/run examples/es_cartpole.py                       # 20 generations, 4 workers
    scripts/run examples/es_cartpole.py --generations 8 --population 24 --workers 2
    FIBER_BACKEND=docker scripts/run examples/es_cartpole.py  # the same, one container per worker

As in Salimans et al. (2017) and the Fiber paper: a linear numpy policy, a **shared noise
table** that every worker builds once in the pool's initializer from a seed (so a task carries
an index into it, not a noise vector), mirrored sampling, centred ranks. Each generation is one
``pool.map``; a dead worker's evaluations rerun elsewhere. The mean reward of each generation
is printed, and the curve saved as CSV and then a PNG (``--plot``; the PNG needs matplotlib).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import fibercore as mp

NOISE_SEED, NOISE_SIZE = 123, 1_000_000
NOISE: np.ndarray | None = None  # each worker's copy of the shared noise table
ENV: gym.Env | None = None  # each worker's environment, made once


def noise_table() -> np.ndarray:
    """The same table in every process: 1M float32 (4 MB) drawn from one seed."""
    return np.random.default_rng(NOISE_SEED).standard_normal(NOISE_SIZE, dtype=np.float32)


def init_worker() -> None:
    """The pool's initializer: build the noise table and the environment once per worker."""
    global NOISE, ENV
    NOISE = noise_table()
    ENV = gym.make("CartPole-v1")


def rollout(env: gym.Env, theta: np.ndarray, seed: int) -> float:
    """One episode of the linear policy ``action = [obs, 1] . theta > 0``; returns its reward."""
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        action = int(np.dot(theta[:-1], obs) + theta[-1] > 0)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        done = terminated or truncated
    return total


def evaluate(task: tuple[np.ndarray, int, float, int]) -> tuple[float, float]:
    """Rewards of theta + sigma*eps and theta - sigma*eps, eps = NOISE[index:index+dim]."""
    theta, index, sigma, seed = task
    assert NOISE is not None and ENV is not None, "the pool's initializer did not run"
    eps = NOISE[index:index + theta.size]
    return rollout(ENV, theta + sigma * eps, seed), rollout(ENV, theta - sigma * eps, seed)


def centred_ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(x.size, dtype=np.float32)
    ranks[x.ravel().argsort()] = np.arange(x.size, dtype=np.float32)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


def train(generations: int, population: int, workers: int, sigma: float = 0.1, lr: float = 0.1,
          seed: int = 0) -> list[float]:
    """Run ES; returns the mean reward of each generation's population."""
    rng = np.random.default_rng(seed)
    noise = noise_table()
    dim = gym.make("CartPole-v1").observation_space.shape[0] + 1
    theta = np.zeros(dim, dtype=np.float32)
    curve = []
    with mp.Pool(workers, initializer=init_worker) as pool:
        for gen in range(generations):
            t0 = time.perf_counter()
            indices = rng.integers(0, NOISE_SIZE - dim, size=population // 2)
            tasks = [(theta, int(i), sigma, gen * population + k) for k, i in enumerate(indices)]
            rewards = np.array(pool.map(evaluate, tasks), dtype=np.float32)  # (population/2, 2)
            weights = centred_ranks(rewards)
            step = sum((w[0] - w[1]) * noise[i:i + dim] for w, i in zip(weights, indices, strict=True))
            theta = theta + lr / (population * sigma) * step
            curve.append(float(rewards.mean()))
            print(f"generation {gen:3d}: mean reward {curve[-1]:6.1f}, best {rewards.max():5.0f} "
                  f"({time.perf_counter() - t0:.2f} s, {population} episodes on {pool.size} workers)",
                  flush=True)
    return curve


def plot(curve: list[float], path: str) -> None:
    """The reward curve as a PNG; without matplotlib, one line that says how to get it (the
    curve itself was printed and saved beside it already)."""
    try:
        import matplotlib
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install matplotlib); the curve is in {path}.csv")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(curve)), curve, marker="o")
    ax.set_xlabel("generation")
    ax.set_ylabel("mean episode reward")
    ax.set_title("ES on CartPole-v1 with a fibercore Pool")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"reward curve saved to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--population", type=int, default=48, help="episodes per generation (even)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--plot", default="es_cartpole.png", help="PNG of the reward curve ('' for none)")
    args = parser.parse_args(argv)
    if args.population < 4 or args.population % 2:
        parser.error("--population must be an even number, 4 or more (mirrored sampling)")
    curve = train(args.generations, args.population, args.workers)
    first, last = curve[0], max(curve[-3:])
    print(f"mean reward: generation 0 {first:.1f} -> best of the last three {last:.1f}")
    if args.plot:
        with open(args.plot + ".csv", "w") as fh:  # the work first, the optional picture after
            fh.write("generation,mean_reward\n" + "".join(f"{g},{r:.3f}\n" for g, r in enumerate(curve)))
        plot(curve, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
