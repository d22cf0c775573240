"""Benchmarks and figures: ``sakura bench`` (every system over the same trace offsets, link model and
metrics; :mod:`bench`, :mod:`figures`, :mod:`plots`), the paper's figures and our additional studies
(equal bytes, tails, estimators, sensitivity, projection), load tests and the quality explorer's
frontier.

Sits on top: imports any part of ``sakura``; in ``sakura`` only the CLI (``sakura.cli``) imports it,
inside its commands.
"""
