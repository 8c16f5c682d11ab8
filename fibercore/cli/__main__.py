"""``python -m fibercore.cli`` is the ``fiber`` command."""

import sys

from fibercore.cli import main

sys.exit(main())
