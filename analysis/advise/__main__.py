"""`python -m analysis.advise`: runs command.py's `main`."""

from analysis.advise.command import main
from analysis.cli import exit_process

if __name__ == "__main__":
    exit_process(main())
