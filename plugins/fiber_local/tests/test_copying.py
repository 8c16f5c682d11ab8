"""``fiber cp`` on the local backend follows no link inside a job's directory, and local jobs
are held by pidfd (fiber_local.copying, fiber_local.owned): the cases the CLI tests do not reach."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fiber_local import copying, owned
from fiber_local.copying import CopyRefused


def _copy(job_dir: Path, job_path: str, local_path: str, into_job: bool) -> None:
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        job = copying.in_job(fd, "42", job_path)
    finally:
        os.close(fd)
    here = copying.local(local_path)
    try:
        copying.copy(here, job) if into_job else copying.copy(job, here)
    finally:
        job.close()
        here.close()


def test_a_tree_copies_out_and_in_and_a_file_lands_in_a_directory(tmp_path, monkeypatch):
    job = tmp_path / "job"
    (job / "results" / "deep").mkdir(parents=True)
    (job / "results" / "a.txt").write_text("a")
    (job / "results" / "deep" / "b.txt").write_text("b")
    (job / "results" / "a.txt").chmod(0o640)
    out = tmp_path / "out"
    _copy(job, "results", str(out), into_job=False)
    assert (out / "a.txt").read_text() == "a" and (out / "deep" / "b.txt").read_text() == "b"
    assert (out / "a.txt").stat().st_mode & 0o777 == 0o640
    monkeypatch.chdir(tmp_path)
    (tmp_path / "note.txt").write_text("n")
    _copy(job, "results/deep", "note.txt", into_job=True)  # into a directory: keeps its name
    assert (job / "results" / "deep" / "note.txt").read_text() == "n"
    _copy(job, ".", "out", into_job=True)  # a tree's contents into the job's directory itself
    assert (job / "a.txt").read_text() == "a" and (job / "deep" / "b.txt").read_text() == "b"
    assert not list(job.rglob(".*fibercp-*"))  # no partial file left


@pytest.mark.parametrize("where", ["last", "middle", "inside a tree", "absolute"])
def test_a_link_anywhere_in_the_jobs_path_is_refused_and_its_target_unchanged(tmp_path, monkeypatch, where):
    job = tmp_path / "job"
    job.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("mine")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "key").write_text("overwritten")
    if where == "last":
        (job / "key").symlink_to(secret / "key")
        path = "key"
    elif where == "middle":
        (job / "sub").symlink_to(secret)
        path = "sub/key"
    elif where == "absolute":
        (job / "sub").symlink_to(secret)
        path = f"{job}/sub/key"
    else:
        (job / "tree").mkdir()
        (job / "tree" / "plain.txt").write_text("p")
        (job / "tree" / "key").symlink_to(secret / "key")
        with pytest.raises(CopyRefused, match=r"42:tree/key is a symbolic link; fiber cp never follows"):
            _copy(job, "tree", str(tmp_path / "out"), into_job=False)
        return
    with pytest.raises(CopyRefused, match="is a symbolic link; fiber cp never follows a link"):
        _copy(job, path, "key", into_job=True)
    with pytest.raises(CopyRefused, match="is a symbolic link"):
        _copy(job, path, str(tmp_path / "got"), into_job=False)
    assert (secret / "key").read_text() == "mine" and not (tmp_path / "got").exists()


def test_the_local_last_component_is_not_followed_either(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    (job / "data.txt").write_text("job data")
    (tmp_path / "mine.txt").write_text("mine")
    (tmp_path / "link.txt").symlink_to(tmp_path / "mine.txt")
    with pytest.raises(CopyRefused, match=r"link.txt is a symbolic link"):
        _copy(job, "data.txt", str(tmp_path / "link.txt"), into_job=False)
    assert (tmp_path / "mine.txt").read_text() == "mine"


def test_a_fifo_is_refused_at_once_and_a_hard_link_is_replaced_not_written_through(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    os.mkfifo(job / "pipe")
    started = time.monotonic()
    with pytest.raises(CopyRefused, match="42:pipe is not a regular file or directory"):
        _copy(job, "pipe", str(tmp_path / "out"), into_job=False)
    assert time.monotonic() - started < 10  # refused, not blocked opening a FIFO nobody writes
    other = tmp_path / "other.txt"
    other.write_text("other")
    os.link(other, job / "hard.txt")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "new.txt").write_text("new")
    _copy(job, "hard.txt", "new.txt", into_job=True)
    assert (job / "hard.txt").read_text() == "new" and other.read_text() == "other"


def test_missing_paths_are_one_line_errors(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    with pytest.raises(CopyRefused, match="42:nope.txt: no such file or directory"):
        _copy(job, "nope.txt", str(tmp_path / "x"), into_job=False)
    with pytest.raises(CopyRefused, match="42:no: No such file or directory"):
        _copy(job, "no/such/file", str(tmp_path / "x"), into_job=False)


def test_a_held_process_is_signalled_only_while_it_runs():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # exec'd: its own environment
        held = owned.own_process(child.pid)
        assert held is not None and held.alive() and owned.is_mine(child.pid)
        assert b"PATH" in held.env
        with held:
            assert held.signal(signal.SIGKILL)
            child.wait(30)  # reaped: its pid may be anyone's now
            assert not held.alive() and not held.signal(signal.SIGKILL)
        assert owned.own_process(child.pid) is None
        assert owned.own_process(os.getpid()) is None  # never this process itself
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
