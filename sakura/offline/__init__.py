"""Offline, server-side cache construction: weighted low-rank factors, progressive packs, baselines.

- :mod:`lowrank`   importance-weighted truncated SVD of one cache unit
- :mod:`quant`     bit-plane scalar quantisation of factor components (centre reconstruction)
- :mod:`container` the shared file framing: JSON header, chunk index, CRC32s, memory-mapped reads
- :mod:`pack`      the SAKURA progressive pack: write, read, byte ranges, decode
- :mod:`tradeoff`  the rank–precision frontier per shard and the budgeted pick
- :mod:`intq`      IntQ baseline (uniform integer quantisation, 2/3/4/8 bits)
- :mod:`cachegen`  CacheGen baseline (per-token quantisation, layer-group bins, range coding, levels)
- :mod:`synthetic` a DiT-like synthetic cache for tests and benchmarks
"""

from sakura.offline.container import PackFormatError
from sakura.offline.pack import PackInfo, PackReader, decode_factors, decode_shard, write_pack
from sakura.offline.tradeoff import Config, best_config, frontier

__all__ = ["PackFormatError", "PackInfo", "PackReader", "decode_factors", "decode_shard", "write_pack",
           "Config", "best_config", "frontier"]
