"""Sensitivity studies (paper §6.4): Fig. 16 mask ratio and Fig. 18 resolution.

- :mod:`.variants`   the derived templates and models (manifests, scaled masks, resolutions)
- :mod:`.sweep`      the sweep both studies run (CPU-clock compute, records, summaries, figure footer)
- :mod:`.mask_ratio` Fig. 16, :mod:`.resolution` Fig. 18

Both sweeps derive *variants* of one template (fs-astronaut by default: the same image and the same
requests), write them as a catalog manifest into the bench folder, build their packs there and run
every system on the same trace offsets with the harness of :mod:`sakura.eval.bench`.

- Fig. 16: the template's mask scaled about its centre until the token ratio hits 5/10/20/30/40 %.
- Fig. 18: the embedded Flux2 model at 192², 256², 384² (576 / 1024 / 2304 image tokens). The model
  is not retrained: its codec's resolution is changed (RoPE positions come from the token grid), the
  template is rendered at that resolution, and the reference crop scales with it (it fills the same
  part of the image). The variant is saved as a model folder whose ``sakura.json`` carries the
  resolution, and the derived manifest names that folder as the template's ``model``, so the builder
  and the harness load it like any other model.

One network and one device for the whole sweep, as in the paper: every variant runs on the same
trace scale, the paper regime of the *reference* variant (the mask ratio nearest the catalog
template's own, or the model's native resolution), unless ``--trace-scale`` fixes it.

Device time is measured on the CPU clock of the measuring thread with one torch thread
(``compute_clock="cpu"``, the default): shard compute (:func:`.sweep.measure_compute_cpu`) and the
decode of every received unit (:func:`.sweep.run_one_cpu`). The sweep compares variants measured
minutes apart, and on a shared machine wall-clock timings drift with other load by more than the
differences being measured (we saw a 30 % mask measure 3x faster than a 20 % one). ``compute_clock="wall"`` uses the
harness's own wall-clock measurements. Either way the simulated clock replays measured times.
"""

from sakura.eval.sensitivity.mask_ratio import fig16_mask_ratio
from sakura.eval.sensitivity.resolution import fig18_resolution

__all__ = ["fig16_mask_ratio", "fig18_resolution"]
