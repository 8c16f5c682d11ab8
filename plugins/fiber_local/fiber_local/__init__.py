"""fiber-local: the fibercore backend where every Fiber process is a local OS process."""

__version__ = "0.1.0"
