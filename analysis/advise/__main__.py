"""`python -m analysis.advise`: runs command.py's `main`."""

import sys

from analysis.advise.command import main

if __name__ == "__main__":
    sys.exit(main())
