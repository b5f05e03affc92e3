import sys

from pyrt.cli import main

sys.exit(main())
