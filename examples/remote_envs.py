# requires: gymnasium numpy
"""The Fiber paper's RL pattern: gymnasium environments behind an AsyncManager, stepped in parallel.

    scripts/run examples/remote_envs.py
    scripts/run examples/remote_envs.py --envs 16 --steps 200

As in the Fiber blog (only the import differs): the manager server is a job that holds the
environments; ``env.step(action)`` returns a handle at once, so all environments step
concurrently; ``handle.get()`` waits for each observation. The policy (a fixed linear
controller here; a learner in practice) runs in the master on the batch of observations.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import fibercore as fiber  # the blog: import fiber


class RemoteEnvManager(fiber.managers.AsyncManager):
    pass


class Env:
    """One gymnasium environment living in the manager's job; restarts when an episode ends."""

    def __init__(self, name: str = "CartPole-v1", seed: int = 0) -> None:
        self.env = gym.make(name)
        self.seed = seed
        self.episode_reward = 0.0
        self.finished: list[float] = []

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset(seed=self.seed)
        return obs

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.episode_reward += float(reward)
        done = terminated or truncated
        if done:
            self.finished.append(self.episode_reward)
            self.episode_reward = 0.0
            self.seed += 1000
            obs, _ = self.env.reset(seed=self.seed)
        return obs, float(reward), done

    def episode_rewards(self) -> list[float]:
        return list(self.finished)


RemoteEnvManager.register("Env", Env)


def policy(obs: np.ndarray) -> np.ndarray:
    """A linear controller for the whole batch: push the cart the way the pole falls."""
    return (obs @ np.array([0.0, 0.0, 1.0, 0.5]) > 0).astype(int)


def train(steps: int = 200, num_envs: int = 8) -> dict[str, float]:
    """Step ``num_envs`` remote environments ``steps`` times; returns counts and rewards."""
    manager = RemoteEnvManager()
    manager.start()
    try:
        envs = [manager.Env("CartPole-v1", seed=i) for i in range(num_envs)]
        obs = np.stack([handle.get() for handle in [env.reset() for env in envs]])
        total = 0.0
        for _ in range(steps):
            actions = policy(obs)
            handles = [env.step(int(a)) for env, a in zip(envs, actions, strict=True)]
            results = [handle.get() for handle in handles]
            obs = np.stack([r[0] for r in results])
            total += sum(r[1] for r in results)
        episodes = [r for env in envs for r in env.episode_rewards().get()]
    finally:
        manager.shutdown()
    return {"steps": steps * num_envs, "reward": total,
            "episodes": len(episodes), "mean_episode_reward": float(np.mean(episodes)) if episodes else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    out = train(args.steps, args.envs)
    print(f"{args.envs} remote CartPole envs x {args.steps} steps = {out['steps']} steps in "
          f"{time.perf_counter() - t0:.2f} s; reward {out['reward']:.0f}, {out['episodes']} episodes "
          f"finished, mean {out['mean_episode_reward']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
