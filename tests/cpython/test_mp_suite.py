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
    Lock = staticmethod(fibercore.Lock)
    RLock = staticmethod(fibercore.RLock)
    Semaphore = staticmethod(fibercore.Semaphore)
    BoundedSemaphore = staticmethod(fibercore.BoundedSemaphore)
    Condition = staticmethod(fibercore.Condition)
    Event = staticmethod(fibercore.Event)
    Barrier = staticmethod(fibercore.Barrier)
    Value = staticmethod(fibercore.Value)
    Array = staticmethod(fibercore.Array)
    RawValue = staticmethod(fibercore.RawValue)
    RawArray = staticmethod(fibercore.RawArray)


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
    Lock = property(operator.attrgetter("manager.Lock"))
    RLock = property(operator.attrgetter("manager.RLock"))
    Semaphore = property(operator.attrgetter("manager.Semaphore"))
    BoundedSemaphore = property(operator.attrgetter("manager.BoundedSemaphore"))
    Condition = property(operator.attrgetter("manager.Condition"))
    Event = property(operator.attrgetter("manager.Event"))
    Barrier = property(operator.attrgetter("manager.Barrier"))

    @classmethod
    def Pool(cls, *args, **kwds):
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
                   "_TestPoolWorkerErrors", "_TestPoolWorkerLifetime", "_TestConnection", "_TestPoll",
                   "_TestLock", "_TestSemaphore", "_TestCondition", "_TestEvent", "_TestBarrier",
                   "_TestValue", "_TestArray"]
MANAGER_CLASSES = ["_TestQueue", "_TestContainers", "_TestMyManager", "_TestRemoteManager",
                   "_TestManagerRestart", "_TestLock", "_TestSemaphore", "_TestCondition", "_TestEvent",
                   "_TestBarrier"]


#: Tests that cannot apply to fibercore, with the reason (also in docs/multiprocessing-compat.md);
#: a "processes:" or "manager:" prefix limits one to that flavour.
NOT_APPLICABLE: dict[str, str] = {
    "_TestConnection.test_fd_transfer": "passes an OS file descriptor to the other process "
        "(SCM_RIGHTS): a job on another machine has no access to this machine's descriptors",
    "_TestConnection.test_large_fd_transfer": "passes an OS file descriptor (see test_fd_transfer)",
    "_TestConnection.test_missing_fd_transfer": "passes an OS file descriptor (see test_fd_transfer)",
    "_TestBarrier.test_thousand": "five jobs write into one end of one Pipe and expect the reader "
        "to get their messages in the order a Lock put them in: an OS pipe is one buffer they all "
        "write into; a fibercore Pipe end sent to several jobs gives each its own connection, and "
        "messages on different connections are not ordered; matching it would make every send on a "
        "shared end wait for the reader's acknowledgement (the Barrier itself keeps the rounds: "
        "tests/test_sync.py checks the same 5-job rounds through shared state)",
    "_TestPoll.test_boundaries": "reads one end of a Pipe from two processes (an OS pipe is one "
        "buffer they share); a fibercore Pipe connects two processes: use a Queue for several readers",
}


class _FiberDummyList:
    """The counter ``_TestBarrier`` counts parties with (``append`` and ``len``). CPython's
    ``_DummyList`` keeps it in multiprocessing's own shared memory and lock, which cannot
    reach a job; this one is the same counter on fibercore's shared ``Value``."""

    def __init__(self) -> None:
        self._count = fibercore.Value("i", 0)

    def append(self, _: object) -> None:
        with self._count.get_lock():
            self._count.value += 1

    def __len__(self) -> int:
        return self._count.value


#: Helpers of the CPython tests that use multiprocessing's own internals, replaced for the
#: processes flavour by the same helper on fibercore (the tests themselves are unchanged).
HELPERS: dict[str, dict[str, object]] = {
    "_TestBarrier": {"DummyList": lambda self: _FiberDummyList()},
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
                     for flavour, _, what in [key.rpartition(":")]
                     for cls_name, test in [what.split(".")]
                     if cls_name == name and hasattr(base, test) and flavour in ("", type_)}
            helpers = HELPERS.get(name, {}) if type_ == "processes" else {}
            cls = type(newname, (base, mixin, unittest.TestCase),
                       {"__module__": namespace["__name__"], **skips, **helpers})
            cls.__qualname__ = newname
            namespace[newname] = cls


build(globals())  # at import, so that a worker unpickling a test's target finds its class
