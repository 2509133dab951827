"""``python -m bench``: see :mod:`bench.run_all`."""

import sys

from bench.run_all import main

sys.exit(main())
