"""`python -m analysis.timeline`: runs command.py's `main`."""

from analysis.cli import exit_process
from analysis.timeline.command import main

if __name__ == "__main__":
    exit_process(main())
