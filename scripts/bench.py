#!/usr/bin/env python
"""Thin wrapper: ``python scripts/bench.py [--quick] ...`` == ``noulengine bench ...``."""

import sys

from noulengine.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
