"""``python -m dpfl.cli``: the ``dpfl`` command."""

import sys

from dpfl.cli.main import main

sys.exit(main())
