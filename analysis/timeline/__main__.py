"""`python -m analysis.timeline`: runs command.py's `main`."""

import sys

from analysis.timeline.command import main

if __name__ == "__main__":
    sys.exit(main())
