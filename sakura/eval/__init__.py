"""Benchmarks and figures: ``sakura bench`` (every system over the same trace offsets, link model and
metrics; :mod:`bench`, :mod:`figures`, :mod:`plots`), the paper's figures and our additional studies
(equal bytes, tails, estimators, sensitivity, projection), load tests and the quality explorer's
frontier, and the device benchmark (:mod:`device_bench`: rebuild and execute per shard on this device's
backends). Every sweep runs through :func:`bench.sweep`.

Sits on top: imports any part of ``sakura``; in ``sakura`` only the CLI (``sakura.cli``) imports it,
inside its commands.
"""
