"""The one exception the analysis raises for bad input; the CLI prints its message as one line."""


class TraceError(Exception):
    """A path that is not a readable nsys SQLite export, or a bad option; the message says which."""
