"""`python -m analysis.collectives`: runs command.py's `main`."""

from analysis.cli import exit_process
from analysis.collectives.command import main

if __name__ == "__main__":
    exit_process(main())
