"""Online decisions on the device (paper §4.3): what to fetch next, at which level, and what to do when
it is late.

- :mod:`monitor`   the effective transfer rate (RobustMPC / harmonic) and how fast this device rebuilds
- :mod:`deadline`  when execution will need each shard, as the device sees it now
- :mod:`policies`  SAKURA and every streaming baseline as plug-ins over the same runtime and link
- :mod:`fallback`  wait, reuse the previous step, recompute step 0 or go local, within 1.1× local time

Imports only ``sakura.formats`` (levels and their costs; ``sakura.runtime.compute`` for type hints only):
no clock, no I/O.
"""
