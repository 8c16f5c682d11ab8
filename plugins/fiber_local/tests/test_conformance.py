"""fiber-local runs fibercore's backend conformance suite."""

from fibercore.testing import BackendConformance


class TestLocalBackend(BackendConformance):
    backend = "local"
    terminate_exitcode = -15  # SIGTERM, as multiprocessing reports it
    logs_from_elsewhere = "master"  # a local job prints to its master's terminal only
    reports_usage = True  # from /proc
