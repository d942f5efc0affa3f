"""``python -m dledger.testing.nemesis run|long|mutants``: see :mod:`dledger.testing.nemesis.cli`."""

import sys

from dledger.testing.nemesis.cli import main

sys.exit(main())
