"""``sakura export``'s command, now :mod:`sakura.runtime.export_cli` (kept importable under this name)."""

from sakura.runtime.export_cli import export_cmd

__all__ = ["export_cmd"]
