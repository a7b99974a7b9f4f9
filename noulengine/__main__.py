"""``python -m noulengine ...``: the same as the ``noulengine`` console script."""

import sys

from noulengine.cli import main

sys.exit(main())
