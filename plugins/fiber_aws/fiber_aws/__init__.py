"""fiber-aws: the AWS Batch backend plugin of fibercore (entry point ``fiber.backends: aws``)."""

__version__ = "0.1.0"
