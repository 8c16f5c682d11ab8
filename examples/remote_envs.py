"""The Fiber blog's RL sample: environments behind an AsyncManager, stepped in parallel.

    scripts/run examples/remote_envs.py

As written in the blog (only the import differs, and a toy environment stands in
for gym): each ``env.step()`` returns a handle at once; ``handle.get()`` waits.
"""

from __future__ import annotations

import random
import time

import fibercore as fiber  # the blog: import fiber


class RemoteEnvManager(fiber.managers.AsyncManager):
    pass


class Env:
    """A stand-in for a gym environment: stepping costs simulator time."""

    def __init__(self) -> None:
        self.rng = random.Random()
        self.state = 0.0

    def reset(self) -> float:
        self.state = self.rng.random()
        return self.state

    def step(self, action: float = 0.0) -> float:
        time.sleep(0.01)  # the simulator
        self.state += action + self.rng.gauss(0, 0.1)
        return self.state


RemoteEnvManager.register("Env", Env)


def build_model():
    return lambda obs: [-0.1 * o for o in obs]


def update_model(model, observations):
    return model


def train(steps: int = 50, num_envs: int = 10) -> list[float]:
    model = build_model()
    manager = RemoteEnvManager()
    envs = [manager.Env() for i in range(num_envs)]
    handles = [envs[i].reset() for i in range(num_envs)]
    obs = [handle.get() for handle in handles]
    for _ in range(steps):
        actions = model(obs)
        handles = [env.step(action) for env, action in zip(envs, actions, strict=True)]
        obs = [handle.get() for handle in handles]
        model = update_model(model, obs)
    manager.shutdown()
    return obs


if __name__ == "__main__":
    t0 = time.perf_counter()
    final = train()
    print(f"10 remote envs x 50 steps of 10 ms in {time.perf_counter() - t0:.2f} s "
          f"(sequentially: 5 s); final observations {[round(o, 2) for o in final[:3]]}...")
