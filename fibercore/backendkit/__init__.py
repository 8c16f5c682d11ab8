"""What backend plugins share, so that a backend is its engine plus declarations.

- :class:`EngineBackend` and :class:`Engine`: the hooks that only delegate, an engine per
  configuration, the "is this job mine" check and closing at exit, written once; a backend
  writes the engine (one verb per operation) and its declarations (:mod:`.backend`).
- :data:`MASTER_LABEL`, :func:`sessions_to_clean` and :func:`clean_session` give
  ``fiber_cleanup_jobs`` one meaning on every backend: the jobs of sessions whose master is
  gone, a session's master removed first (:mod:`.cleanup`).
- :class:`SecretFiles`: the session secret in a file jobs read, never on a command line or
  in a launcher's environment (:mod:`.secrets`).
- :func:`parse_pairs`, :func:`signal_exit_code`, :func:`outward_address`,
  :func:`process_usage`: config values, container exit statuses, the address jobs elsewhere
  reach, a local process's CPU time and memory (:mod:`.helpers`).
- :func:`preload_worker` and :func:`run_worker`: start jobs by forking a template process,
  as fiber-local does (:mod:`.forking`).

Plugins import these from ``fibercore.backendkit`` itself (the submodules may move).
"""

from fibercore.backendkit.backend import Engine, EngineBackend
from fibercore.backendkit.cleanup import (
    MASTER_LABEL,
    PROCESS_LABEL,
    clean_session,
    master_alive,
    master_label,
    sessions_to_clean,
)
from fibercore.backendkit.forking import WORKER_MODULES, preload_worker, run_worker
from fibercore.backendkit.helpers import outward_address, parse_pairs, process_usage, signal_exit_code
from fibercore.backendkit.secrets import SecretFiles
from fibercore.util import process_start

__all__ = [
    "MASTER_LABEL",
    "PROCESS_LABEL",
    "WORKER_MODULES",
    "Engine",
    "EngineBackend",
    "SecretFiles",
    "clean_session",
    "master_alive",
    "master_label",
    "outward_address",
    "parse_pairs",
    "preload_worker",
    "process_start",
    "process_usage",
    "run_worker",
    "sessions_to_clean",
    "signal_exit_code",
]
