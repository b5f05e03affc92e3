"""``python -m pyrt``: the `pyrt` command line (:func:`pyrt.tools.cli.main`)."""

import sys

from pyrt.tools.cli import main

sys.exit(main())
