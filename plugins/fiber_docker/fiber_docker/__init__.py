"""fiber-docker: the Docker backend plugin of fibercore (entry point ``fiber.backends: docker``)."""

__version__ = "0.1.0"

#: The image jobs run when ``image`` is not set, and what ``python -m fiber_docker.image`` builds.
DEFAULT_IMAGE = "fibercore-worker:latest"
