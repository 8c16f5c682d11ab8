"""fiber-k8s: the Kubernetes backend plugin of fibercore (entry points ``fiber.backends: kubernetes``, ``k8s``)."""

# The version is written once, in pyproject.toml: importlib.metadata.version(...) reads it.
