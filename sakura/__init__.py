"""SAKURA: streaming reusable attention KV state for private on-device image editing."""

import os as _os

# diffusers probes optional torchao kernels at import and warns about missing CUDA builds;
# none of that applies to a CPU device runtime.
_os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
_os.environ.setdefault("HF_HUB_OFFLINE", "1")

__version__ = "0.1.0"
