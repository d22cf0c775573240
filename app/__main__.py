"""``python -m app``: the demo (same as ``sakura demo``)."""

from app.cli import main

main()
