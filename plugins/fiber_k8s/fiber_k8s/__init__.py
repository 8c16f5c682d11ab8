"""fiber-k8s: the Kubernetes backend plugin of fibercore (entry points ``fiber.backends: kubernetes``, ``k8s``)."""

__version__ = "0.1.0"
