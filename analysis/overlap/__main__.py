"""`python -m analysis.overlap`: runs command.py's `main`."""

if __name__ == "__main__":
    from analysis.cli import exit_process

    exit_process("analysis.overlap.command")
