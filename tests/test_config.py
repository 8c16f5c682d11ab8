"""Configuration: precedence, typing, unknown keys, original .fiberconfig files."""

from __future__ import annotations

import pytest

import fibercore
from fibercore import config as cfgmod
from fibercore.errors import ConfigError


def build(file_values=None, env=None, init=None, file_name=".fiberconfig"):
    return cfgmod.build_config(cfgmod.CORE_OPTIONS, file_values or {}, file_name,
                               cfgmod.read_env_values(env or {}), init or {})


def test_precedence_default_file_env_init():
    c = build()
    assert c.start_timeout == 120.0 and c.origin("start_timeout") == "default"
    c = build({"start_timeout": "10"})
    assert c.start_timeout == 10.0
    c = build({"start_timeout": "10"}, {"FIBER_START_TIMEOUT": "20"})
    assert c.start_timeout == 20.0 and "FIBER_START_TIMEOUT" in c.origin("start_timeout")
    c = build({"start_timeout": "10"}, {"FIBER_START_TIMEOUT": "20"}, {"start_timeout": 30})
    assert c.start_timeout == 30.0


@pytest.mark.parametrize("text,value", [("false", False), ("False", False), ("0", False),
                                        ("no", False), ("true", True), ("1", True), ("yes", True)])
def test_booleans_are_typed(text, value):
    assert build(env={"FIBER_DEBUG": text}).debug is value


def test_wrong_typed_env_value_names_variable_and_type():
    with pytest.raises(ConfigError) as info:
        build(env={"FIBER_START_TIMEOUT": "soon"})
    assert "FIBER_START_TIMEOUT" in str(info.value) and "float" in str(info.value)
    with pytest.raises(ConfigError, match="FIBER_DEBUG"):
        build(env={"FIBER_DEBUG": "maybe"})


def test_misspelled_key_names_the_one_meant():
    with pytest.raises(ConfigError) as info:
        build({"start_timout": "3"})
    msg = str(info.value)
    assert msg == "unknown fibercore config key 'start_timout' in .fiberconfig: did you mean 'start_timeout'?"
    with pytest.raises(ConfigError, match="fibercore.init.*Valid keys: .*start_timeout"):
        build(init={"nope": 1})


def test_key_of_a_backend_not_installed_is_one_line_naming_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setattr(cfgmod, "_warned_variables", set())
    c = build({"k8s_namespace": "ml"})  # the file serves a k8s cluster too; local runs
    assert "k8s_namespace" not in c
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'k8s_namespace' (.fiberconfig)" in err
    assert "fiber-k8s backend, which is not installed" in err and "pip install -e plugins/fiber_k8s" in err
    assert "not on a package index yet" in err


READ_START_TIMEOUT = "import fibercore as mp; print(mp.get_runtime().config.get('start_timeout'))"


def _run_with_file(tmp_path, text, backend, code=READ_START_TIMEOUT):
    import subprocess
    import sys

    (tmp_path / ".fiberconfig").write_text(text)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("FIBER_")}
    if backend is not None:
        env["FIBER_BACKEND"] = backend
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_one_file_serves_every_backend_changing_only_FIBER_BACKEND(tmp_path):
    """A file written for the ssh cluster: FIBER_BACKEND=local runs it, silently (was: an
    error calling the installed fiber-ssh 'not installed')."""
    pytest.importorskip("fiber_ssh")
    done = _run_with_file(tmp_path, "[default]\nbackend = ssh\nssh_hosts = a, b\nstart_timeout = 7\n", "local")
    assert (done.returncode, done.stdout, done.stderr) == (0, "7.0\n", "")


def test_a_misspelled_key_of_an_installed_backend_is_still_an_error(tmp_path):
    pytest.importorskip("fiber_ssh")
    done = _run_with_file(tmp_path, "[default]\nssh_hostz = a\n", "local")
    assert done.returncode != 0
    assert "unknown fibercore config key 'ssh_hostz'" in done.stderr
    assert "the fiber-ssh backend has no such key (`FIBER_BACKEND=ssh fiber config --all`" in done.stderr
    assert "not installed" not in done.stderr
    done = _run_with_file(tmp_path, "[default]\nssh_hostz = a\n", "ssh")  # the selected one: did you mean
    assert "did you mean 'ssh_hosts'?" in done.stderr and done.returncode != 0


def test_misspelled_fiber_variable_is_one_short_line_in_the_master_only(capsys, monkeypatch):
    monkeypatch.setattr(cfgmod, "_warned_variables", set())
    c = build(env={"FIBER_START_TIMOUT": "1"})
    assert "start_timout" not in c
    build(env={"FIBER_START_TIMOUT": "1"})  # a second runtime in the same process: no repeat
    err = capsys.readouterr().err
    assert err == "fibercore: ignoring FIBER_START_TIMOUT (no such key): did you mean FIBER_START_TIMEOUT?\n"
    build(env={"FIBER_SOMETHING_ELSE": "1"})
    assert capsys.readouterr().err == ("fibercore: ignoring FIBER_SOMETHING_ELSE: no config key of that name "
                                       "(`fiber config --all` lists them)\n")
    monkeypatch.setenv("FIBER_MASTER_ADDR", "127.0.0.1:1")  # a job: its master said it already
    build(env={"FIBER_OTHER_TYPO": "1"})
    assert capsys.readouterr().err == ""


def test_misspelled_fiberconfig_section_is_an_error(tmp_path, monkeypatch):
    (tmp_path / ".fiberconfig").write_text("[defualt]\nstart_timeout = 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        cfgmod.read_file_values()
    assert str(info.value) == (f"{tmp_path / '.fiberconfig'}: unknown section [defualt]; fibercore reads "
                               "the [default] section only (as the original fiber): rename it to [default]")


def test_original_fiberconfig_file_is_read(tmp_path, monkeypatch):
    (tmp_path / ".fiberconfig").write_text(
        "[default]\nlog_level = debug\ncpu_per_job = 2\nipc_admin_master_port = 9000\nuse_push_queue = True\n"
    )
    monkeypatch.chdir(tmp_path)
    values, name = cfgmod.read_file_values()
    with pytest.warns(UserWarning, match="use_push_queue"):
        c = cfgmod.build_config(cfgmod.CORE_OPTIONS, values, name, {}, {})
    assert c.log_level == "debug" and c.cpu_per_job == 2.0 and c.ipc_admin_master_port == 9000


def test_tool_fiber_in_pyproject(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.fiber]\nstart_timeout = 5\ndebug = true\n")
    monkeypatch.chdir(tmp_path)
    values, name = cfgmod.read_file_values()
    c = cfgmod.build_config(cfgmod.CORE_OPTIONS, values, name, {}, {})
    assert c.start_timeout == 5.0 and c.debug is True and "tool.fiber" in c.origin("debug")


def test_init_rejects_unknown_keys(fresh_runtime):
    with pytest.raises(ConfigError, match="Valid keys"):
        fibercore.init(not_a_key=1)
    with pytest.raises(ConfigError, match="did you mean 'start_timeout'"):
        fibercore.init(start_timout=1)


def test_to_env_round_trips_non_defaults():
    c = build(init={"debug": True, "start_timeout": 7.5})
    env = c.to_env()
    assert env == {"FIBER_DEBUG": "true", "FIBER_START_TIMEOUT": "7.5"}
    again = build(env=env)
    assert again.debug is True and again.start_timeout == 7.5


def test_jobs_do_not_inherit_where_the_master_listens():
    """A job runs elsewhere (a container, a pod) and must ask its backend for its own address."""
    c = build(init={"listen_host": "10.1.2.3", "bind_host": "0.0.0.0", "debug": True})
    assert c.to_env() == {"FIBER_DEBUG": "true"}


def test_plugin_options_are_typed(fresh_runtime):
    c = fibercore.init(local_echo_output="false")
    assert c.local_echo_output is False
    assert c.options["local_echo_output"].plugin.endswith("local")


def test_another_backends_key_with_no_backend_chosen_says_the_program_runs_here(tmp_path):
    """No backend named anywhere: a file with ssh_hosts was likely meant for the ssh backend,
    so running on the local one is said in one line (not silently, not an error)."""
    pytest.importorskip("fiber_ssh")
    done = _run_with_file(tmp_path, "[default]\nssh_hosts = a, b\n", None)
    assert done.returncode == 0 and done.stdout == "120.0\n", done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "ignoring 'ssh_hosts'" in done.stderr and "no backend was chosen" in done.stderr
    assert "runs on local" in done.stderr and "set backend = ssh (or FIBER_BACKEND=ssh)" in done.stderr


def test_another_backends_key_in_init_or_asked_by_name_is_an_error_naming_that_backend(tmp_path):
    pytest.importorskip("fiber_ssh")
    code = "import fibercore as mp; mp.init(backend='local', ssh_hosts='a:2')"
    done = _run_with_file(tmp_path, "[default]\n", None, code)
    assert done.returncode != 0
    assert "`ssh_hosts` is a key of the ssh backend (fiber-ssh), which is not the selected one" in done.stderr
    assert "init(backend='ssh')" in done.stderr and "has no such key" not in done.stderr
    from fibercore.testing import fiber

    shown = fiber("config", "ssh_hosts", env={"FIBER_BACKEND": "local"}, cwd=tmp_path)
    assert "which is not the selected one" in shown.stderr
    assert "FIBER_BACKEND=ssh fiber config ssh_hosts" in shown.stderr
