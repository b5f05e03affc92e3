import sys

from pyrt.tools.cli import main

sys.exit(main())
