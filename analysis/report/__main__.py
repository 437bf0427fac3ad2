"""`python -m analysis.report`: runs command.py's `main`."""

from analysis.cli import exit_process
from analysis.report.command import main

if __name__ == "__main__":
    exit_process(main())
