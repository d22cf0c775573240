"""The device runtime: one edit put together (:mod:`session`: ``EditSession.edit`` is the one call) and run
on the real clock (:mod:`stream`: receiver → reconstructor → executor threads) or the simulated one
(:mod:`sim`), both carrying out the decisions of one scheduler (:mod:`scheduler`), with the shard
executors (:mod:`executors`), rebuild backends (:mod:`reconstruct`), measured compute and calibration,
prefetch, the timeline, and the device-side CLI bodies (``sakura edit --stream``, ``bench-device``,
``export``).

Imports the library below it (``model``, ``formats``, ``online``, ``net``, ``catalog``, ``offline`` for
bench-device's packs, ``server`` for the CLI's local server); never ``sakura.eval``, ``app`` or
``device_bridge``.
"""
