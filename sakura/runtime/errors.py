"""What can go wrong in an edit that is not the user's input (those raise ModelInputError / CatalogError)."""

from __future__ import annotations


class StreamError(RuntimeError):
    """The cache stream failed (link error, malformed bytes, timeout); the message is one line."""


class TemplateUnavailable(RuntimeError):
    """The template's stored files are not where the device looks for them (not built, or not published)."""



class EditCancelled(RuntimeError):
    """The person (or the client that asked for the edit) went away; the edit stops at its next step."""
