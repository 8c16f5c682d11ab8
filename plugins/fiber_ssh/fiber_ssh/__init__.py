"""fiber-ssh: fibercore jobs on a list of machines reached over SSH (``FIBER_BACKEND=ssh``)."""
