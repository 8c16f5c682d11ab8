"""Discovery, backend selection, check_pending, tracing, and the hook meta-tests."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import fibercore
from fibercore import hookspecs
from fibercore.errors import BackendNotFoundError, ConfigError
from fibercore.plugins import Plugins, installed_backends

ROOT = Path(__file__).resolve().parents[1]
HOOKS = sorted(name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
               if name.startswith("fiber_"))


def test_local_backend_is_installed_and_default(fresh_runtime):
    assert "local" in installed_backends()
    fibercore.init()
    assert fibercore.get_runtime().backend == "local"


def test_unknown_backend_lists_installed_and_names_only_real_distributions(fresh_runtime, monkeypatch):
    with pytest.raises(BackendNotFoundError) as info:
        fibercore.init(backend="yarn")
    msg = str(info.value)
    assert "'yarn'" in msg and "local" in msg and "fiber-yarn" not in msg and "pip install" not in msg
    with pytest.raises(BackendNotFoundError, match="did you mean 'local'"):
        fibercore.init(backend="locl")
    # the project's own backends are named by their distribution, with the way to install it
    from fibercore import plugins

    monkeypatch.setattr(plugins, "installed_backends", lambda: ["local"])
    for name, dist in [("kubernetes", "fiber-k8s"), ("aws", "fiber-aws"), ("slurm", "fiber-slurm")]:
        msg = plugins.unknown_backend_message(name)
        assert f"is the {dist} distribution" in msg, msg
        assert f"pip install -e plugins/{dist.replace('-', '_')}" in msg and "--find-links dist/" in msg
        assert "not on a package index yet" in msg and "\n" not in msg


def test_env_backend_selection(fresh_runtime, monkeypatch):
    monkeypatch.setenv("FIBER_BACKEND", "nope")
    with pytest.raises(BackendNotFoundError):
        fibercore.init()


def test_misspelled_hook_fails_at_startup(fresh_runtime):
    class Bad:
        @fibercore.hookimpl
        def fiber_create_jobs(self, spec):  # typo: not a hook
            return None

    bad = Bad()
    fibercore.register_plugin(bad)
    try:
        with pytest.raises(ConfigError, match="fiber_create_jobs"):
            fibercore.init()
    finally:
        fibercore.unregister_plugin(bad)


def test_trace_hooks(fresh_runtime, monkeypatch, capsys):
    monkeypatch.setenv("FIBER_TRACE_HOOKS", "1")
    fibercore.init()
    fibercore.get_runtime().plugins.listen_host()
    assert "[fiber hook] fiber_listen_host" in capsys.readouterr().err


def test_builtins_are_replaceable(fresh_runtime):
    from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer

    class Marked(CloudpickleSerializer):
        name = "marked"

    class Provider:
        @fibercore.hookimpl
        def fiber_serializer(self, config):
            return Marked()

    plugin = Provider()
    fibercore.register_plugin(plugin)
    try:
        fibercore.init()
        assert fibercore.get_runtime().serializer.name == "marked"
    finally:
        fibercore.unregister_plugin(plugin)


def test_observer_hooks_see_jobs(fresh_runtime):
    from tests.helpers import sleep_then_put

    seen = []

    class Observer:
        @fibercore.hookimpl
        def fiber_job_started(self, job, spec):
            seen.append(("started", spec.cpu, spec.memory, spec.labels["fiber-session"]))

        @fibercore.hookimpl
        def fiber_job_exited(self, job, exitcode):
            seen.append(("exited", exitcode))

    obs = Observer()
    fibercore.register_plugin(obs)
    try:
        q = fibercore.Queue()
        target = fibercore.meta(cpu=2, memory=512)(sleep_then_put)
        p = fibercore.Process(target=target, args=(q, 0))
        p.start()
        q.get(timeout=30)
        p.join(30)
        session = fibercore.get_runtime().session
        assert seen == [("started", 2, 512, session), ("exited", 0)]
    finally:
        fibercore.unregister_plugin(obs)


def test_describe_lists_plugins_and_hooks():
    names = dict(fibercore.get_runtime().plugins.describe())
    assert any("fiber_create_job" in hooks for hooks in names.values())
    assert "fibercore.builtins.tcp_transport" in names


# -- meta-tests (datasette's pattern) ----------------------------------------------------------


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook):
    doc = (ROOT / "docs" / "hooks.md").read_text()
    assert f"`{hook}" in doc, f"{hook} is missing from docs/hooks.md"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    sources = [p.read_text() for p in (ROOT / "tests").glob("test_*.py")]
    sources += [p.read_text() for p in (ROOT / "plugins").glob("*/tests/test_*.py")]
    sources += [(ROOT / "fibercore" / "testing" / "conformance.py").read_text()]
    calls = {
        "fiber_create_job": "Process(", "fiber_job_status": "job_status", "fiber_wait_job": ".join(",
        "fiber_terminate_job": ".terminate()", "fiber_job_logs": ".logs()", "fiber_listen_host": "listen_host",
        "fiber_transport": "forged", "fiber_serializer": "fiber_serializer", "fiber_job_started": "fiber_job_started",
        "fiber_job_exited": "fiber_job_exited", "fiber_worker_start": "fiber_worker_start",
        "fiber_detect_backend": "fiber_detect_backend", "fiber_config_options": "local_echo_output",
        "fiber_cleanup_jobs": "cleanup", "fiber_list_jobs": "plugins.list_jobs(",
        "fiber_read_job_logs": "plugins.read_job_logs(", "fiber_follow_logs": "plugins.follow_logs(",
        "fiber_copy_files": 'fiber("cp"', "fiber_doctor": "plugins.doctor(",
        "fiber_job_usage": "plugins.job_usage(",
    }
    needle = calls.get(hook, hook)
    assert any(re.search(re.escape(needle), src) for src in sources), f"no test exercises {hook}"


def test_plugins_facade_is_the_only_caller():
    for path in (ROOT / "fibercore").rglob("*.py"):
        if path.name in ("plugins.py", "hookspecs.py"):
            continue
        assert "pm.hook." not in path.read_text(), f"{path} calls pm.hook directly"


def test_facade_loads_selected_backend_only():
    p = Plugins.load("local")
    names = [n for n, _ in p.pm.list_name_plugin()]
    assert "fiber.backends:local" in names


# -- hook contract 3 ---------------------------------------------------------------------------


@pytest.mark.parametrize("declared,fix", [(hookspecs.CONTRACT_VERSION + 1, "upgrade fibercore"),
                                          (hookspecs.MIN_CONTRACT_VERSION - 1, "upgrade the plugin")])
def test_a_plugin_declaring_a_contract_this_core_does_not_speak_is_refused(fresh_runtime, declared, fix):
    class Other:
        FIBER_CONTRACT = declared

        @fibercore.hookimpl
        def fiber_listen_host(self, config):
            return None

    with pytest.raises(ConfigError, match=f"contract {declared}") as info:
        fibercore.register_plugin(Other())
    assert fix in str(info.value)


def test_job_hooks_get_the_config_and_the_spec_says_session_and_interpreter(fresh_runtime):
    """Contract 2: the job hooks receive the effective config; the spec carries the session,
    the interpreter the user asked for (None: the backend's) and the worker's arguments; the
    backend reports the command it ran on the Job and leaves the spec as it was."""
    import sys

    from tests.helpers import sleep_then_put

    seen = {}

    class Observer:
        FIBER_CONTRACT = 3

        @fibercore.hookimpl(hookwrapper=True)
        def fiber_create_job(self, spec, config):
            seen["config"] = config
            seen["args_before"] = list(spec.args)
            yield

        @fibercore.hookimpl
        def fiber_job_started(self, job, spec):
            seen["job"], seen["spec"] = job, spec

    obs = Observer()
    fibercore.register_plugin(obs)
    try:
        fibercore.init(start_timeout=77)
        q = fibercore.Queue()
        p = fibercore.Process(target=sleep_then_put, args=(q, 0))
        p.start()
        q.get(timeout=30)
        p.join(30)
        rt = fibercore.get_runtime()
        assert seen["config"] is rt.config and seen["config"].get("start_timeout") == 77
        spec, job = seen["spec"], seen["job"]
        assert spec.session == rt.session and spec.python is None
        assert spec.args == seen["args_before"] == ["-m", "fibercore.worker"]
        assert job.command == [sys.executable, "-m", "fibercore.worker"]
        assert spec.argv("python") == ["python", "-m", "fibercore.worker"]
    finally:
        fibercore.unregister_plugin(obs)


def test_fiber_backends_shows_the_contract_versions(capsys):
    from fibercore.cli import main

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert f"hook contract {hookspecs.CONTRACT_VERSION}" in out
    assert re.search(r"^  local\s+-\s+fiber-local \S+\s+3\s+fiber_local.plugin:plugin$", out, re.M), out
    # each backend once, its other names in the aliases column
    backends = out.split("Selected backend")[0]
    if "kubernetes" in installed_backends():  # not in scripts/drift's core-only venv
        assert re.search(r"^  kubernetes\s+k8s\s+fiber-k8s", backends, re.M), out
        assert not re.search(r"^  k8s\s", backends, re.M), out
