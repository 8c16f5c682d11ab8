"""fiber-aws: the AWS Batch backend plugin of fibercore (entry point ``fiber.backends: aws``)."""

# The version is written once, in pyproject.toml: importlib.metadata.version(...) reads it.
