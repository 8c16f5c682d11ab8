"""Every program in examples/ runs, at a small size, on the local backend, as a user runs it."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run(script: str | pathlib.Path, *args: str, cwd: pathlib.Path, timeout: float = 240) -> str:
    """Run an example as ``python examples/X.py args``; returns its stdout, fails with its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_es_on_cartpole_improves_the_reward_and_saves_its_curve(tmp_path):
    png = tmp_path / "es_cartpole.png"
    out = run(EXAMPLES / "es_cartpole.py", "--generations", "8", "--population", "24", "--workers", "2",
              "--plot", str(png), cwd=tmp_path)
    rewards = [float(m) for m in re.findall(r"mean reward\s+([\d.]+),", out)]
    assert len(rewards) == 8, out
    assert max(rewards[-3:]) > 2 * rewards[0] and max(rewards[-3:]) > 50, out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    curve = (tmp_path / "es_cartpole.png.csv").read_text().splitlines()  # saved before the picture
    assert curve[0] == "generation,mean_reward" and len(curve) == 9
    artifacts = os.environ.get("FIBER_TEST_ARTIFACTS")
    if artifacts:  # CI keeps the picture
        pathlib.Path(artifacts).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(artifacts) / png.name).write_bytes(data)


def test_remote_gymnasium_envs_step_through_an_async_manager(tmp_path):
    out = run(EXAMPLES / "remote_envs.py", "--envs", "4", "--steps", "60", cwd=tmp_path)
    assert re.search(r"4 remote CartPole envs x 60 steps = 240 steps", out), out
    reward = float(re.search(r"reward (\d+)", out).group(1))
    assert 0 < reward <= 240


def test_an_unmodified_multiprocessing_program_gives_the_same_output(tmp_path):
    source = (EXAMPLES / "mp_unmodified.py").read_text()
    changed = [line for line in source.splitlines() if "fibercore" in line and line.startswith(("import", "from"))]
    assert changed == ["import fibercore as multiprocessing  # was: import multiprocessing"]
    stdlib = tmp_path / "stdlib_version.py"
    stdlib.write_text(source.replace(changed[0], "import multiprocessing"))
    with_fibercore = run(EXAMPLES / "mp_unmodified.py", cwd=tmp_path)
    assert with_fibercore == run(stdlib, cwd=tmp_path)
    assert "counter: 600" in with_fibercore and "pipe: HELLO" in with_fibercore


def test_process_pool_executor_with_fibercores_context(tmp_path):
    out = run(EXAMPLES / "futures_executor.py", cwd=tmp_path)
    assert "1099726899285419 is prime: False" in out and "17 is prime: True" in out
    assert {"2**10 = 1024", "2**20 = 1048576", "2**30 = 1073741824"} <= set(out.splitlines())


def test_parameter_server_sgd_on_cartpole_in_its_three_modes(tmp_path):
    out = run(EXAMPLES / "paramserver_cartpole.py", "--workers", "3", "--rounds", "8", cwd=tmp_path)
    initial = float(re.search(r"initial policy return: ([\d.]+)", out).group(1))
    rows = re.findall(r"^(BSP|bounded|async) .*?([\d.]+)\s+(\d+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["BSP", "bounded", "async"], out
    versions = {r[0]: int(r[2]) for r in rows}
    assert versions == {"BSP": 8, "bounded": 24, "async": 24}, out  # a round each, a gradient each
    finals = [float(r[3]) for r in rows]
    assert all(f > initial for f in finals) and max(finals) > 100, out


def test_pycma_through_the_executor_improves(tmp_path):
    pytest.importorskip("cma")
    out = run(EXAMPLES / "executor_cma.py", "--dim", "6", "--workers", "2", "--iterations", "15", cwd=tmp_path)
    first, final = map(float, re.search(r"first population's best ([\d.]+), final best ([\d.]+)", out).groups())
    assert final < first, out


@pytest.mark.parametrize("name, expect", [
    ("quickstart.py", r"pi"),
    ("pool_progress.py", r"500"),
    ("es.py", r"generation"),
    ("ring_allreduce.py", r"all members done"),
])
def test_the_other_examples_run(tmp_path, name, expect):
    out = run(EXAMPLES / name, cwd=tmp_path)
    assert re.search(expect, out, re.I), out


def test_every_example_says_what_it_needs_and_the_examples_page_repeats_it():
    """Each example's first lines name what it imports beyond fibercore (``# requires:``), and
    docs/examples.md shows the same for it: a newcomer knows before running it."""
    page = (EXAMPLES.parent / "docs" / "examples.md").read_text()
    for example in sorted(EXAMPLES.glob("*.py")):
        head = example.read_text().splitlines()[:3]
        (line,) = [x for x in head if x.startswith("# requires: ")]
        need = line.removeprefix("# requires: ")
        row = [r for r in page.splitlines() if r.startswith(f"| `examples/{example.name}`")]
        assert row, f"docs/examples.md has no row for {example.name}"
        shown = "—" if need.startswith("nothing") else ", ".join(f"`{m}`" for m in need.split())
        assert f"| {shown} |" in row[0], f"{example.name}: the page should say it needs {shown}"


def test_scripts_run_says_in_one_line_what_an_example_lacks(tmp_path):
    """A program whose ``# requires:`` names a module that is not installed: scripts/run says
    which, and the command that installs it, in one line, with exit code 2; nothing runs."""
    program = tmp_path / "needs.py"
    program.write_text("# requires: numpy no_such_module_for_fibercore.sub\nprint('ran')\n")
    if sys.prefix == sys.base_prefix:
        pytest.skip("scripts/run sets up and uses a venv: this test runs it with the suite's, and there is none")
    root = EXAMPLES.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    env["FIBER_VENV"] = sys.prefix
    done = subprocess.run([str(root / "scripts" / "run"), "needs.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("scripts/run: needs.py needs no_such_module_for_fibercore.sub, not installed "
                                  "here: install it with ")
    assert "pip install -c " in done.stderr and "constraints.txt no_such_module_for_fibercore" in done.stderr
