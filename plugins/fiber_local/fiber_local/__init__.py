"""fiber-local: the fibercore backend where every Fiber process is a local OS process."""

# The version is written once, in pyproject.toml: importlib.metadata.version(...) reads it.
