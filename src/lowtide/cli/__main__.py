"""``python -m lowtide.cli``: the ``lowtide`` command."""

import sys

from lowtide.cli import main

sys.exit(main())
