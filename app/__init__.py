"""The Gradio demo (the edit page with its live timeline, the quality explorer) and the user study, an app of its
own (``sakura study``: ``study*.py``, plain FastAPI pages).

Reaches the model only through :mod:`device_bridge` (the device agent); from ``sakura`` it takes the
catalog, traces, the explorer's frontier, pack builds and the template server it starts. ``sakura`` and
``device_bridge`` never import it.
"""
