"""fiber-nng: fibercore's transport on nng (pynng), selected with ``transport = "nng"``."""
