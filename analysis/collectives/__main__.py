"""`python -m analysis.collectives`: runs command.py's `main`."""

import sys

from analysis.collectives.command import main

if __name__ == "__main__":
    sys.exit(main())
