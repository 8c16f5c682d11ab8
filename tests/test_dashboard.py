"""The dashboard in a real headless browser, ``fiber top`` in a real terminal, and what both read.

A real program (tests/dashboard_program.py: a Pool with printing tasks, a Queue, a Lock)
runs on the local backend. The browser is Debian's chromium driven through its
chromedriver by selenium; the terminal is a tmux server of the test's own, stopped by
its PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fiber_local.forking import process_alive as alive

import fibercore as mp
from fibercore.observe import recorder as rec_mod
from fibercore.observe import status
from fibercore.testing.ci import skip_or_fail

HERE = Path(__file__).parent
PROGRAM = HERE / "dashboard_program.py"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def wait_for(check: Any, timeout: float = 30.0, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Program:
    """tests/dashboard_program.py running, with its output collected."""

    def __init__(self, tmp: Path, env: dict[str, str], tasks: int = 2000) -> None:
        self.stop_file = tmp / "stop"
        self.out = tmp / "program.out"
        self.env = {**os.environ, "FIBER_STATUS_DIR": str(tmp / "status"), "PYTHONPATH": str(HERE.parent), **env}
        self.proc = subprocess.Popen([sys.executable, str(PROGRAM), str(self.stop_file), str(tasks)],
                                     stdout=open(self.out, "wb"), stderr=subprocess.STDOUT, env=self.env, cwd=tmp)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def finish(self) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the program did not end:\n{self.output()[-3000:]}") from None


@pytest.fixture
def program_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    old = os.environ.get("FIBER_STATUS_DIR")
    os.environ["FIBER_STATUS_DIR"] = str(tmp_path / "status")  # fiber top in this process looks here too
    yield {}
    if old is None:
        os.environ.pop("FIBER_STATUS_DIR", None)
    else:
        os.environ["FIBER_STATUS_DIR"] = old


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as res:
            return res.status, res.read().decode(), dict(res.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


# -- the browser ------------------------------------------------------------------------------
@pytest.fixture
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        skip_or_fail("Debian's chromium and chromium-driver are not installed (apt-get install chromium "
                     "chromium-driver; scripts/test does it)", "dashboard browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-extensions", "--no-first-run",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1600"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def table_rows(driver: Any, table: str) -> list[list[str]]:
    """A table's cells, read in one script (the page redraws its tables every second)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(r => Array.from(r.cells, c => c.textContent))",
        f"#{table} tbody tr")


def pool_workers(driver: Any) -> list[list[str]] | None:
    """The jobs table's rows of Pool-1's two workers, once both are there."""
    rows = [r for r in table_rows(driver, "jobs") if len(r) > 1 and r[1] == "worker of Pool-1"]
    return rows if len(rows) == 2 else None


def done_count(driver: Any) -> int:
    rows = table_rows(driver, "pools")
    return int(rows[0][8]) if rows and rows[0] and rows[0][8].isdigit() else -1


def save_artifact(name: str, data: bytes, tmp: Path) -> Path:
    folder = Path(os.environ.get("FIBER_TEST_ARTIFACTS") or tmp)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def test_the_dashboard_in_a_real_browser_shows_workers_moving_counts_and_a_jobs_log(
        browser: Any, program_env: dict[str, str], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    prog = Program(tmp_path, {"FIBER_DASHBOARD": "1"})
    try:
        found = wait_for(lambda: re.search(r"dashboard at (http://127\.0\.0\.1:\d+/[\w-]+/)\?token=(\S+)",
                                           prog.output()),
                         30, "the dashboard's URL")
        base, token = found.group(1), found.group(2)

        # Nothing is served without the token: not the page, its scripts or the API.
        for path in ("", "static/dashboard.js", "static/uPlot.iife.min.js", "api/state", "api/logs/1"):
            code, body, _ = fetch(base + path)
            assert code == 403 and "token" in body, (path, code, body)
            assert fetch(base + path + "?token=wrong" + token[:4])[0] == 403
        assert fetch(base + "api/state", {"X-Fiber-Token": token})[0] == 200

        browser.get(f"{base}?token={token}")
        wait_for(lambda: len(table_rows(browser, "pools")) == 1, 30, "the pool in the page")
        workers = wait_for(lambda: pool_workers(browser), 30, "both workers in the jobs table")
        assert all(r[5] == "running" and r[2] == "local" for r in workers), workers
        first = wait_for(lambda: done_count(browser) if done_count(browser) > 0 else None, 30, "tasks done")
        wait_for(lambda: done_count(browser) > first, 10, "the task count moving")
        pools = table_rows(browser, "pools")[0]
        assert pools[0] == "Pool-1" and pools[1] == "running" and int(pools[2]) + int(pools[3]) == 2, pools
        assert int(pools[6]) > 0  # tasks still queued
        assert table_rows(browser, "queues")[0][1] == "3"
        assert any(r[1] == "Lock" for r in table_rows(browser, "sync"))
        # The plots were drawn (uPlot makes a canvas per chart).
        assert len(browser.find_elements(By.CSS_SELECTOR, ".charts canvas")) >= 4

        # A job's log: click the first worker.
        browser.execute_script("document.querySelector('#jobs tbody tr.job').click()")
        wait_for(lambda: "task-" in browser.find_element(By.ID, "log").text, 15, "the job's output")
        time.sleep(1.5)  # a tick more of the plots for the picture
        shot = save_artifact("dashboard.png", browser.get_screenshot_as_png(), tmp_path)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pids = [int(r[3]) for r in workers]
    finally:
        prog.finish()
    assert prog.proc.returncode == 0, prog.output()[-3000:]
    wait_for(lambda: not any(alive(p) for p in pids), 15, "the workers gone")
    with pytest.raises(OSError):  # the server went with the program
        urllib.request.urlopen(base, timeout=3)
    assert not list((tmp_path / "status").glob("*.master")), "the program's status files stayed"


# -- fiber top in a terminal ----------------------------------------------------------------------
class Tmux:
    """A tmux server of this test's own (its socket in tmp), stopped by its PID."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        if shutil.which("tmux") is None:
            skip_or_fail("tmux is not installed (apt-get install tmux)", "fiber top")
        self.socket = str(tmp / "tmux.sock")
        self.env = env
        self.pid: int | None = None

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True,
                              env=self.env, timeout=20).stdout

    def start(self, command: str) -> None:
        self.run("new-session", "-d", "-s", "top", "-x", "150", "-y", "45", command)
        self.pid = int(self.run("display-message", "-p", "-t", "top", "#{pid}").strip())

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def stop(self) -> None:
        if self.pid is not None and alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
            wait_for(lambda: not alive(self.pid or 0), 10, "the tmux server gone")


def top_done(screen: str) -> int | None:
    found = re.search(r"^Pool-1\s+running\s+(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)", screen, re.M)
    return int(found.group(3)) if found else None


def test_fiber_top_in_a_terminal_shows_the_pool_moving_and_quits_on_q(program_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    prog = Program(tmp_path, {})
    tmux = Tmux(tmp_path, prog.env)
    try:
        tmux.start(f"{sys.executable} -m fibercore.cli top")
        pane_pid = int(tmux.run("display-message", "-p", "-t", "top", "#{pane_pid}").strip())
        first = wait_for(lambda: top_done(tmux.screen()), 40, "the pool in fiber top")
        wait_for(lambda: (top_done(tmux.screen()) or 0) > first, 15, "the task count moving in fiber top")
        screen = tmux.screen()
        assert screen.startswith("fiber top · 1 program on this machine"), screen
        assert len(re.findall(r"^Pool-1-Worker-\d\s+worker of Pool-1\s+local\s+\d+\s+127\.0\.0\.1\s+running",
                              screen, re.M)) == 2, screen
        assert "queues: " in screen and "(3 waiting)" in screen, screen
        tmux.run("send-keys", "-t", "top", "q")
        wait_for(lambda: not alive(pane_pid), 10, "fiber top to quit on q")
        # Ctrl-C quits as cleanly (its last session gone, that tmux server ended: a new one).
        tmux.stop()
        tmux.start(f"{sys.executable} -m fibercore.cli top")
        second = int(tmux.run("display-message", "-p", "-t", "top", "#{pane_pid}").strip())
        wait_for(lambda: top_done(tmux.screen()), 30, "the pool in the second fiber top")
        tmux.run("send-keys", "-t", "top", "C-c")
        wait_for(lambda: not alive(second), 10, "fiber top to quit on Ctrl-C")
    finally:
        tmux.stop()
        prog.finish()
    assert prog.proc.returncode == 0, prog.output()[-3000:]


def test_fiber_top_once_and_a_session_that_is_not_running(program_env: dict[str, str], tmp_path: Path) -> None:
    prog = Program(tmp_path, {})
    try:
        wait_for(lambda: status.sessions(), 30, "the program's status file")
        out = subprocess.run([sys.executable, "-m", "fibercore.cli", "top", "--once"], capture_output=True,
                             text=True, env=prog.env, timeout=60)
        assert out.returncode == 0 and re.search(r"^Pool-1\s+running", out.stdout, re.M), out
        session = status.sessions()[0]["session"]
        assert f"session {session}" in out.stdout
        bad = subprocess.run([sys.executable, "-m", "fibercore.cli", "top", "nosuchsession"], capture_output=True,
                             text=True, env=prog.env, timeout=60)
        assert bad.returncode == 2
        assert bad.stderr.strip().splitlines() == [
            "fiber top: no program of session nosuchsession runs on this machine: `fiber top` alone lists the "
            "ones that do"]
    finally:
        prog.finish()
    assert status.sessions() == []


# -- what they read, in this process ------------------------------------------------------------
def test_pool_counters_match_the_tasks_and_name_the_last_error() -> None:
    import tests.futures_tasks as T

    with mp.Pool(2) as pool:
        assert pool.map(T.square, range(37), chunksize=5) == [x * x for x in range(37)]
        pool.apply(T.square, (3,))
        with pytest.raises(ZeroDivisionError):
            pool.apply(divmod, (1, 0))
        stats = pool.stats
        assert stats["done_tasks"] == 38 and stats["failed_tasks"] == 1, stats
        view = pool._view()
        assert view is not None
        assert view["last_error"][1].startswith("apply(divmod): ZeroDivisionError"), view["last_error"]
        assert view["queued"] == 0 and view["running"] == 0 and len(view["workers"]) == 2


def test_a_snapshot_lists_jobs_pools_queues_and_shared_objects_as_json() -> None:
    with mp.Pool(1) as pool:
        pool.apply(abs, (-1,))
        q = mp.Queue()
        q.put("x")
        ev = mp.Event()
        found = rec_mod.master_started()
        assert found is not None
        snap = found.sample()
        json.dumps(snap)  # plain data
        mine = [p for p in snap["pools"] if p["name"] == pool._name]
        assert mine and mine[0]["worker_counts"]["idle"] + mine[0]["worker_counts"]["busy"] == 1
        assert any(j["role"] == f"worker of {pool._name}" and j["rss_bytes"] for j in snap["jobs"])
        assert any(x["depth"] == 1 for x in snap["queues"])
        assert any(o["kind"] == "Event" and o["state"].startswith("clear") for o in snap["sync"])
        ev.set()
        with mp.Manager() as manager:
            snap = found.sample()
            assert any(o["kind"] == "Event" and o["state"] == "set" for o in snap["sync"])
            assert [m["state"] for m in snap["managers"] if m["address"] == str(manager.address)] == ["started"]
            assert any(j["role"] == "server of SyncManager" and j["state"] == "running" for j in snap["jobs"])
        assert found.history and set(found.history[-1]) >= {"t", "tasks_per_s", "busy", "idle", "queued"}


def test_the_status_directory_is_refused_when_it_is_a_link(tmp_path: Path, monkeypatch: Any) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv("FIBER_STATUS_DIR", str(link))
    with pytest.raises(PermissionError, match="point FIBER_STATUS_DIR at a directory of your own"):
        status.status_dir()


def test_the_dashboard_without_aiohttp_is_one_warning_line_and_the_program_goes_on(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['aiohttp'] = None\n"
            "import fibercore as mp\n"
            "from fibercore import dashboard\n"
            "if __name__ == '__main__':\n"
            "    mp.init(dashboard=True)\n"
            "    with mp.Pool(1) as pool:\n"
            "        print('result', pool.apply(abs, (-5,)), dashboard.url())\n")
    (tmp_path / "app.py").write_text(code)
    out = subprocess.run([sys.executable, str(tmp_path / "app.py")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FIBER_STATUS_DIR": str(tmp_path / "status")}, cwd=tmp_path)
    assert out.returncode == 0 and "result 5 None" in out.stdout, out
    lines = [line for line in out.stderr.splitlines() if "dashboard" in line]
    assert len(lines) == 1 and lines[0].startswith("fibercore: WARNING: no dashboard: the dashboard needs aiohttp"), out
    assert "pip install 'fibercore[dashboard]'" in lines[0] and "Traceback" not in out.stderr, out


def test_a_dashboard_port_in_use_is_one_warning_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = ("import fibercore as mp\n"
                "from fibercore import dashboard\n"
                "if __name__ == '__main__':\n"
                f"    mp.init(dashboard=True, dashboard_port={port})\n"
                "    with mp.Pool(1) as pool:\n"
                "        print('result', pool.apply(abs, (-5,)), dashboard.url())\n")
        (tmp_path / "app.py").write_text(code)
        out = subprocess.run([sys.executable, str(tmp_path / "app.py")], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "FIBER_STATUS_DIR": str(tmp_path / "status")},
                             cwd=tmp_path)
    assert out.returncode == 0 and "result 5 None" in out.stdout, out
    warned = [line for line in out.stderr.splitlines() if "WARNING" in line]
    assert len(warned) == 1 and f"cannot listen on 127.0.0.1:{port}" in warned[0], out


def test_fiber_top_renders_control_characters_escaped() -> None:
    from fibercore.cli.top import printable, render

    assert printable("a\x1b]52;c;eA==\x07\x9b2J\u202e\tz") == "a\\x1b]52;c;eA==\\x07\\x9b2J\\u202e\\tz"
    snap = {"program": "prog\x1b]0;title\x07", "backend": "local", "time": 10.0, "started": 5.0,
            "master": {"pid": 1, "cpu_percent": None, "rss_bytes": None},
            "pools": [{"name": "P\x1b[2J", "state": "running", "worker_counts": {"busy": 0, "idle": 1, "starting": 0,
                                                                               "dead": 0},
                       "stats": {"done_tasks": 0, "failed_tasks": 1, "retried_chunks": 0, "rerun_after_error": 0},
                       "queued": 0, "running": 0, "tasks_per_s": None, "broken": None,
                       "last_error": {"time": 1.0, "text": "ValueError: \x1b]52;c;ZXZpbA==\x07"}}],
            "jobs": [{"name": "j\x07", "role": "process", "backend": "local", "jid": 1, "host": "h\x1b",
                      "state": "running", "cpu_percent": None, "rss_bytes": None}],
            "queues": [], "managers": [], "sync": []}
    lines = render([{"session": "s\x1bx", "pid": 1}], {"s\x1bx": snap})
    text = "\n".join(lines)
    assert not any(ch in text for ch in "\x1b\x07\x9b"), text
    assert "\\x1b]52;c;ZXZpbA==\\x07" in text and "prog\\x1b]0;title\\x07" in text, text


def test_fiber_run_dashboard_starts_it_in_the_master_it_runs(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        "import fibercore as mp\n"
        "from fibercore import dashboard\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(1) as pool:\n"
        "        print('result', pool.apply(abs, (-7,)), 'url', dashboard.url() is not None, flush=True)\n")
    out = subprocess.run([sys.executable, "-m", "fibercore.cli", "run", "--dashboard", "--", "python", str(app)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "FIBER_STATUS_DIR": str(tmp_path / "status")})
    assert out.returncode == 0, out
    assert "result 7 url True" in out.stdout, out
    assert re.search(r"^fibercore: dashboard at http://127\.0\.0\.1:\d+/[\w-]{12,}/\?token=\S{20,}$",
                     out.stderr + out.stdout, re.M), out


@pytest.mark.forks_master
def test_a_child_forked_from_a_master_leaves_the_masters_status_alone(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("FIBER_STATUS_DIR", str(tmp_path))
    rec_mod._recorder = None
    with mp.Pool(1) as pool:
        pool.apply(abs, (-1,))
        found = rec_mod.master_started()
        assert found is not None and [s["pid"] for s in status.sessions()] == [os.getpid()]
        pid = os.fork()
        if pid == 0:  # the child: starting jobs here must not announce (or later remove) the session
            code = 1
            try:
                code = 0 if rec_mod.master_started() is None else 3
            finally:
                os._exit(code)
        _, code = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(code) == 0
        assert [s["pid"] for s in status.sessions()] == [os.getpid()]
    found.close()
    rec_mod._recorder = None


def test_observe_never_imports_the_dashboard_nor_other_modules_privates() -> None:
    """The dashboard depends on observe, never the other way; the snapshot reads through the registry."""
    import ast

    root = Path(mp.__file__).parent / "observe"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith("fibercore.dashboard") or n == "fibercore.dashboard" for n in names), path
            if isinstance(node, ast.ImportFrom) and node.module == "fibercore":
                assert not any(a.name == "dashboard" for a in node.names), path
    snapshot = (root / "snapshot.py").read_text()
    for private in ("_children", "brokers", "_service", "_popen"):
        assert private not in snapshot, private
    code = ("import sys, fibercore.observe.recorder, fibercore.observe.snapshot, fibercore.observe.status, "
            "fibercore.cli.top\nprint('fibercore.dashboard' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out
