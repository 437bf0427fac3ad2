"""Finding a Chromium-family browser: kaleido draws the timeline's PNG with it (and the page checks
under tests/support open pages in it)."""

from __future__ import annotations

import shutil

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium-family executable on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None
