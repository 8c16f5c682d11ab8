"""``fiber run``: ship a program to the backend and run its master there, as the original's CLI did.

    fiber run --backend kubernetes --build --push 127.0.0.1:5000 -- python app.py --gens 10

1. The image: ``--image I`` as given, or ``--build [DIR]``: DIR's Dockerfile, else one
   generated from the fibercore worker image plus DIR and its ``requirements.txt``, tagged
   by the hash of its content (fiber-docker builds it; see ``fiber_docker.project``), then
   ``--push REGISTRY`` pushes it there and the jobs pull it from there.
2. The master: the program runs as one job of the backend (a process, a container, a pod,
   a Batch job) with this machine's configuration (``FIBER_*``), ``--env`` values and
   resources; it joins this command's session, so its jobs and it are ``fiber ps`` one
   session and ``fiber stop SESSION`` stops them all.
3. Its output is streamed here (``fiber_follow_logs``, or the backend's own echo) and its
   exit code becomes this command's. Ctrl-C stops the master (SIGTERM, then kill after
   ``--grace`` seconds) and then every job of the session. ``--detach`` prints the session
   and returns once the master is started.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from fibercore.errors import ConfigError, ProcessError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHONS = re.compile(r"^python(\d+(\.\d+)?)?$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="backend that runs the master and its jobs (default: the selected one)")
    image = p.add_mutually_exclusive_group()
    image.add_argument("--image", help="image of the master and its jobs (container backends)")
    image.add_argument("--build", nargs="?", const=".", metavar="DIR",
                       help="build the image from DIR (default: .): its Dockerfile, or the worker image + DIR")
    p.add_argument("--base", help="image --build starts from when DIR has no Dockerfile "
                                  "(default: the image/default_image config)")
    p.add_argument("--push", metavar="REGISTRY", help="push the built image to REGISTRY (host:port[/path]); "
                                                      "jobs pull it from there")
    p.add_argument("--cpu", type=float, help="CPUs of the master's job")
    p.add_argument("--memory", type=int, help="memory (MiB) of the master's job")
    p.add_argument("--gpu", type=int, help="GPUs of the master's job")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable of the master (repeatable; FIBER_K=V sets config key k)")
    p.add_argument("--dashboard", action="store_true",
                   help="serve the program's web dashboard (FIBER_DASHBOARD=1; its URL is printed)")
    p.add_argument("--detach", action="store_true", help="return once the master started; print its session")
    p.add_argument("--grace", type=float, default=10.0, help="seconds Ctrl-C waits for the master to stop")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the program, usually: python app.py args")


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``K=V`` strings to a dict; a bad one is a ConfigError naming it and the form."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ConfigError(f"--env {pair!r} is not NAME=VALUE (a name of letters, digits and _, not "
                              "starting with a digit): for example --env SEED=3")
        env[key] = value
    return env


def split_command(command: list[str]) -> tuple[str | None, list[str]]:
    """(interpreter or None, its arguments): ``python app.py`` -> (None, [app.py]) so that the
    backend runs the python of the place the job runs; ``app.py`` alone means the same (a
    script is not a program the job could execute itself); anything else runs as given."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no program to run: give it after --, for example `fiber run -- python app.py`")
    if _PYTHONS.match(os.path.basename(command[0])):
        return None, command[1:]
    if command[0].endswith(".py"):
        return None, command
    return command[0], command[1:]


def _image(args: argparse.Namespace, cfg: Any) -> str | None:
    if args.build is None:
        if args.push:
            raise ConfigError("--push pushes the image --build makes: add --build [DIR]")
        return args.image
    try:
        from fiber_docker.project import build_project_image, push_image
    except ImportError:
        from fibercore.plugins import install_hint

        raise ConfigError(f"--build builds the image with fiber-docker, which is not installed: "
                          f"{install_hint('fiber-docker')}") from None
    base = args.base or cfg.get("image") or cfg.get("default_image")
    image = build_project_image(args.build, base=base, log=lambda text: print(text, file=sys.stderr))
    if args.push:
        image = push_image(image, args.push, log=lambda text: print(text, file=sys.stderr))
    return image


def _overrides(args: argparse.Namespace, image: str | None, options: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """Config for this run: the image for every job; code shipped in an image is not
    mounted over from here; a pushed image is pulled each time (the tag may move)."""
    out: dict[str, Any] = {}
    if image:
        out["image"] = image
        if "docker_mount_cwd" in options:
            out["docker_mount_cwd"] = False
        if args.push and "k8s_image_pull_policy" in options and cfg.origin("k8s_image_pull_policy") == "default":
            out["k8s_image_pull_policy"] = "Always"
    if "docker_nested" in options and cfg.origin("docker_nested") == "default":
        out["docker_nested"] = True  # the master's container starts jobs: it gets the Docker socket
    return out


def main(args: argparse.Namespace) -> int:
    from fibercore.runtime import get_runtime, init
    from fibercore.types import JobSpec

    user_env = parse_env(args.env)
    if args.dashboard:
        user_env.setdefault("FIBER_DASHBOARD", "1")
    python, program_args = split_command(args.program)
    if python is None:  # a Python program: fibercore takes the secret's descriptor before its code runs
        from fibercore.cli.boot import interpreter_options

        options, program = interpreter_options(program_args)
        program_args = [*options, "-m", "fibercore.cli.boot", *program]
    if args.backend:
        init(backend=args.backend)
    rt = get_runtime()
    if args.detach and rt.backend == "local":
        raise ConfigError("--detach needs a cluster backend: local jobs are children of this command "
                          "(use nohup or a terminal multiplexer, or --backend docker/kubernetes/aws)")
    image = _image(args, rt.config)
    overrides = _overrides(args, image, rt.config.options, rt.config)
    if overrides:
        init(**({"backend": args.backend} if args.backend else {}), **overrides)
        rt = get_runtime()
    cfg = rt.config
    env = cfg.to_env()
    if overrides.get("docker_nested"):  # ... its own jobs do not (docker_nested's default)
        env["FIBER_DOCKER_NESTED"] = "0"
    spec = JobSpec(
        args=program_args,
        python=python or cfg.get("python_exe") or None,
        session=rt.session,
        env={**env, "FIBER_BACKEND": rt.backend, "FIBER_SESSION": rt.session, **user_env},
        secret_env={"FIBER_SECRET": rt.secret.hex()},
        name="master",
        image=cfg.get("image") or cfg.get("default_image"),
        cpu=args.cpu, memory=args.memory, gpu=args.gpu,
        # fiber-detached: a backend whose jobs end with this command (ssh sessions) refuses it.
        labels={"fiber-session": rt.session, "fiber-process": "master",
                **({"fiber-detached": "true"} if args.detach else {})},
        cwd=os.getcwd() if rt.backend == "local" else None,
    )
    try:
        job = rt.plugins.create_job(spec)
    except ProcessError:
        raise
    except FileNotFoundError as exc:
        raise ConfigError(f"no program {exc.filename or python!r} to run on {rt.backend!r}: give the command "
                          "as you would type it there, for example `fiber run -- python app.py`") from None
    except Exception as exc:
        raise ProcessError(f"backend {rt.backend!r} could not start the master: {type(exc).__name__}: {exc}") from exc
    print(f"fiber run: session {rt.session}, master job {job.jid} on {rt.backend}"
          + (f" ({image})" if image else ""), file=sys.stderr, flush=True)
    if args.detach:
        return _detach(rt, job)
    return _attend(rt, job, args.grace)


def _detach(rt: Any, job: Any) -> int:
    """Wait until the master runs (or ended), print the session, and leave without the exit
    handlers that would stop the jobs this process started (the master is one of them)."""
    from fibercore.types import JobStatus

    deadline = time.monotonic() + float(rt.config.get("start_timeout") or 120)
    status = rt.plugins.job_status(job)
    while status is JobStatus.PENDING and time.monotonic() < deadline:
        time.sleep(0.2)
        status = rt.plugins.job_status(job)
    if status is JobStatus.EXITED:
        code = rt.plugins.wait_job(job, 5)
        print(f"fiber run: the master ended at once (exit code {code}):\n{rt.plugins.job_logs(job)}",
              file=sys.stderr)
        return 1
    print(rt.session)
    print(f"fiber run: detached; `fiber ps --session {rt.session}`, `fiber logs {rt.session}`, "
          f"`fiber stop {rt.session}`", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _attend(rt: Any, job: Any, grace: float) -> int:
    """Stream the master's output until it ends; on Ctrl-C (or SIGTERM) stop it and its jobs."""
    plugins = rt.plugins
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stream = plugins.follow_logs(job)
        output = None
        if stream is not None:
            output = threading.Thread(target=_copy_out, args=(stream,), name="fiber-run-output", daemon=True)
            output.start()
        while not stop.is_set():
            code = plugins.wait_job(job, 0.2)
            if code is not None and not stop.is_set() and code != -signal.SIGINT:
                if output is not None:
                    output.join(30)  # the stream ends once the backend has the last lines
                sys.stdout.flush()
                return code if code >= 0 else 128 - code
            if code is not None:
                break  # the master ended of the terminal's Ctrl-C itself
        # Interrupted: the master (if it still runs) and then every job of the session.
        if plugins.wait_job(job, 0) is None:
            plugins.terminate_job(job, force=False)
            if plugins.wait_job(job, grace) is None:
                plugins.terminate_job(job, force=True)
                plugins.wait_job(job, 10)
        _sweep(plugins, rt.session)
        if output is not None:
            output.join(2)
        sys.stdout.flush()
        print(f"fiber run: interrupted; the master ({job.jid}) and every job of session {rt.session} "
              "are stopped", file=sys.stderr, flush=True)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sweep(plugins: Any, session: str, passes: int = 5) -> None:
    """Stop every job of ``session``, again while a pass still finds some: a master being
    stopped may have started one between a backend's listing and its own end."""
    for attempt in range(passes):
        if not plugins.cleanup_jobs(session):
            return
        time.sleep(0.5 * (attempt + 1))


def _copy_out(stream: Any) -> None:
    try:
        for chunk in stream:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except Exception as exc:  # the exit code still comes from wait_job
        print(f"fiber run: the output stream ended: {exc}", file=sys.stderr)
