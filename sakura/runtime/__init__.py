"""The device runtime: one edit put together (:mod:`session`: ``EditSession.edit`` is the one call) and run
on the real clock (:mod:`stream`: receiver → reconstructor → executor threads) or the simulated one
(:mod:`sim`), both carrying out the decisions of one scheduler (:mod:`scheduler`), with the shard
executors (:mod:`executors`), rebuild backends (:mod:`reconstruct`), measured compute and calibration,
prefetch and the timeline.

Imports the library below it (``model``, ``formats``, ``online``, ``net``, ``catalog``); never ``sakura.eval``,
``sakura.cli``, ``app`` or ``device_bridge``.
"""
