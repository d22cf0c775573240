"""Offline, server-side cache construction: what the stored formats hold, computed from a template.

- :mod:`lowrank`   importance-weighted truncated SVD of one cache unit
- :mod:`tradeoff`  the rank–precision frontier per shard and the budgeted pick
- :mod:`compress`  cache + importance → per shard quantised factors + frontier (what a pack stores)
- :mod:`builder`   capture, importance profiling, and writing every format of the registry
- :mod:`synthetic` a DiT-like synthetic cache for tests and benchmarks

The formats themselves (layout, writers, readers, decoders, stream encodings) live in
:mod:`sakura.formats`, which imports nothing from here: the device decodes with them.
"""

from sakura.offline.compress import compress_cache, pack_cache, quantize_factors
from sakura.offline.tradeoff import best_config, frontier

__all__ = ["compress_cache", "pack_cache", "quantize_factors", "best_config", "frontier"]
