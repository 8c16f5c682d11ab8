"""fiber-docker: the Docker backend plugin of fibercore (entry point ``fiber.backends: docker``)."""

__version__ = "0.1.0"
