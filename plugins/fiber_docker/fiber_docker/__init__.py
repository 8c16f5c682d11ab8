"""fiber-docker: the Docker backend plugin of fibercore (entry point ``fiber.backends: docker``)."""

# The version is written once, in pyproject.toml: importlib.metadata.version(...) reads it.

#: The image jobs run when ``image`` is not set, and what ``python -m fiber_docker.image`` builds.
DEFAULT_IMAGE = "fibercore-worker:latest"
