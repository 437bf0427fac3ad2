"""`python -m analysis.advise`: runs command.py's `main`."""

if __name__ == "__main__":
    from analysis.cli import exit_process

    exit_process("analysis.advise.command")
