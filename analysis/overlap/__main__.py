"""`python -m analysis.overlap`: runs command.py's `main`."""

import sys

from analysis.overlap.command import main

if __name__ == "__main__":
    sys.exit(main())
