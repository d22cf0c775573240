"""Errors raised by the catalog. Every message is one line, meant to be shown to a user as is."""

from __future__ import annotations


class CatalogError(ValueError):
    """A manifest, image or mask that cannot be used; the message says which and why (one line)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class UnknownTemplateError(CatalogError, KeyError):
    """``Catalog.get`` was asked for an id the catalog does not hold.

    A ``KeyError`` (so ``catalog[id]``-style callers can catch it as one) and a ``CatalogError``
    (so a CLI can catch every catalog problem at once). ``str()`` is the plain message, without
    the quotes ``KeyError`` would add.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
