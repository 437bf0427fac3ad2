"""Launching ranks and handling their failures (and GPU sharing between ranks)."""
