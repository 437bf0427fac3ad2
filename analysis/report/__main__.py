"""`python -m analysis.report`: runs command.py's `main`."""

import sys

from analysis.report.command import main

if __name__ == "__main__":
    sys.exit(main())
