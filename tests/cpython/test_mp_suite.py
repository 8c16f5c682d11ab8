"""CPython's own multiprocessing tests (``test._test_multiprocessing``), run against fibercore.

The test classes are the installed interpreter's, unmodified; only the mixin that says
*which* implementation to test is ours (as CPython's ``install_tests_in_module_dict``
combines each ``_TestX`` with ``ProcessesMixin`` / ``ManagerMixin``). Tests that cannot
apply to job-backed processes are listed in :data:`NOT_APPLICABLE` with the reason, and
in docs/multiprocessing-compat.md.
"""

from __future__ import annotations

import operator
import unittest

import test._test_multiprocessing as T

import fibercore
import fibercore.connection


def _not_yet(name: str):
    """Synchronisation primitives and shared ctypes do not exist in fibercore yet (its
    issue "Synchronization and shared state across jobs"): tests that need one skip."""
    def factory(*args, **kwargs):
        raise unittest.SkipTest(f"fibercore has no {name} yet (synchronization primitives are a later issue)")
    return staticmethod(factory)


_SYNC = ("Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier")


class FiberProcessesMixin(T.BaseMixin):
    TYPE = "processes"
    Process = fibercore.Process
    connection = fibercore.connection
    current_process = staticmethod(fibercore.current_process)
    parent_process = staticmethod(fibercore.parent_process)
    active_children = staticmethod(fibercore.active_children)
    set_executable = staticmethod(fibercore.set_executable)
    Pool = staticmethod(fibercore.Pool)
    Pipe = staticmethod(fibercore.Pipe)
    Queue = staticmethod(fibercore.Queue)
    JoinableQueue = staticmethod(fibercore.JoinableQueue)
    locals().update({name: _not_yet(name) for name in (*_SYNC, "Value", "Array", "RawValue", "RawArray")})


class FiberManagerMixin(T.BaseMixin):
    TYPE = "manager"
    Process = fibercore.Process
    Queue = property(operator.attrgetter("manager.Queue"))
    JoinableQueue = property(operator.attrgetter("manager.JoinableQueue"))
    Value = property(operator.attrgetter("manager.Value"))
    Array = property(operator.attrgetter("manager.Array"))
    list = property(operator.attrgetter("manager.list"))
    dict = property(operator.attrgetter("manager.dict"))
    Namespace = property(operator.attrgetter("manager.Namespace"))
    locals().update({name: _not_yet(name) for name in _SYNC})

    @classmethod
    def Pool(cls, *args, **kwds):  # noqa: N802
        return cls.manager.Pool(*args, **kwds)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.manager = fibercore.Manager()

    @classmethod
    def tearDownClass(cls):
        cls.manager.shutdown()
        cls.manager = None
        super().tearDownClass()


PROCESS_CLASSES = ["_TestProcess", "_TestSubclassingProcess", "_TestQueue", "_TestPool",
                   "_TestPoolWorkerErrors", "_TestPoolWorkerLifetime", "_TestConnection", "_TestPoll"]
MANAGER_CLASSES = ["_TestQueue", "_TestContainers", "_TestMyManager", "_TestRemoteManager",
                   "_TestManagerRestart"]


#: Tests that cannot apply to fibercore, with the reason (also in docs/multiprocessing-compat.md).
NOT_APPLICABLE: dict[str, str] = {
    "_TestConnection.test_fd_transfer": "passes an OS file descriptor to the other process "
        "(SCM_RIGHTS): a job on another machine has no access to this machine's descriptors",
    "_TestConnection.test_large_fd_transfer": "passes an OS file descriptor (see test_fd_transfer)",
    "_TestConnection.test_missing_fd_transfer": "passes an OS file descriptor (see test_fd_transfer)",
    "_TestPoll.test_boundaries": "reads one end of a Pipe from two processes (an OS pipe is one "
        "buffer they share); a fibercore Pipe connects two processes: use a Queue for several readers",
}


def _manager_like(cls: type) -> type:
    """A fibercore BaseManager subclass with the same registrations as ``cls`` (a manager
    class the CPython tests define on multiprocessing's BaseManager at module level), so that
    the tests of custom and remote managers exercise fibercore, not multiprocessing."""
    from fibercore.managers import AutoProxy, BaseManager, BaseProxy

    twin = type(cls.__name__, (BaseManager,), {"__module__": __name__})
    for typeid, (callable_, exposed, method_to_typeid, proxytype) in cls._registry.items():
        if proxytype is not None and proxytype.__module__ == T.__name__:
            proxytype = type(proxytype.__name__, (BaseProxy,), {
                k: v for k, v in vars(proxytype).items() if k not in ("__dict__", "__weakref__")})
        elif proxytype is not None and proxytype.__module__.startswith("multiprocessing"):
            proxytype = AutoProxy
        twin.register(typeid, callable_, proxytype, exposed, method_to_typeid,
                      create_method=hasattr(cls, typeid))
    return twin


for _name in ("MyManager", "QueueManager", "QueueManager2"):
    setattr(T, _name, _manager_like(getattr(T, _name)))


def build(namespace: dict) -> None:
    """Put the combined test classes into ``namespace`` (a test module's globals)."""
    for type_, names, mixin in (("processes", PROCESS_CLASSES, FiberProcessesMixin),
                                ("manager", MANAGER_CLASSES, FiberManagerMixin)):
        for name in names:
            base = getattr(T, name)
            if type_ not in base.ALLOWED_TYPES:
                continue
            newname = "With" + type_.capitalize() + name[1:]
            skips = {test: unittest.skip(f"not applicable to fibercore: {why}")(getattr(base, test))
                     for key, why in NOT_APPLICABLE.items()
                     for cls_name, test in [key.split(".")] if cls_name == name and hasattr(base, test)}
            cls = type(newname, (base, mixin, unittest.TestCase), {"__module__": namespace["__name__"], **skips})
            cls.__qualname__ = newname
            namespace[newname] = cls


build(globals())  # at import, so that a worker unpickling a test's target finds its class
