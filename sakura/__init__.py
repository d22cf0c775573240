"""SAKURA: streaming reusable attention KV state for private on-device image editing."""

import os as _os

# diffusers probes optional torchao kernels at import and warns about missing CUDA builds;
# none of that applies to a CPU device runtime.
_os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
_os.environ.setdefault("HF_HUB_OFFLINE", "1")

# torchao (pulled in by executorch) logs warnings about CUDA-only kernels when diffusers imports it,
# and torch warns about its pytree registrations: noise on a CPU device.
import logging as _logging
import warnings as _warnings

_logging.getLogger("torchao").setLevel(_logging.ERROR)
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
_warnings.filterwarnings("ignore", message=".*is an Enum subclass.*")

__version__ = "0.1.0"
