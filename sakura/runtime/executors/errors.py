"""Errors shared by the device backends (executors and reconstructors)."""

from __future__ import annotations


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (package, SDK or device missing). The message is one line and
    names what is missing and how to provide it."""
