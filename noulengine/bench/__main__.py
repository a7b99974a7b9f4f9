"""``python -m noulengine.bench [...]``: the same as ``noulengine bench``."""

import sys

from noulengine.bench.cli import main

sys.exit(main())
