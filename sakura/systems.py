"""The one registry of systems: SAKURA and every baseline, with what each one is.

Everything that lists systems (CLI choices, bench rows, figure labels and colours, the app's radio
buttons and tables, the device agent's validation) reads this module; nothing else spells them out.
It is plain data and imports nothing heavy, so the app can read it without loading torch.

``runner`` says how an edit of the system is executed (:mod:`sakura.runtime.runners`): ``stream``
fetches the cache during the edit with the policy of the same name from the stored ``format``;
``local`` runs the whole model without a cache; ``oracle`` has the FP16 cache on the device already.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class System:
    name: str
    label: str  # short, for tables and plots
    title: str  # longer, for the app's choices
    runner: str  # "stream" | "local" | "oracle"
    format: str | None  # the stored format it streams (None: nothing is streamed during the edit)
    color: str

    @property
    def streams(self) -> bool:
        return self.runner == "stream"

    @property
    def runs_locally(self) -> bool:
        """The whole model on every token: no cache at all (what every fallback is bounded against)."""
        return self.runner == "local"

    @property
    def holds_cache(self) -> bool:
        """The whole FP16 cache is on the device before the edit (the floor no streaming system beats)."""
        return self.runner == "oracle"


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("sakura", "SAKURA", "SAKURA", "stream", "sakura", "#d6336c"),
    System("intq", "IntQ", "IntQ (uniform integer quantisation)", "stream", "intq", "#1c7ed6"),
    System("cachegen", "CacheGen", "CacheGen (adapted to DiT)", "stream", "cachegen", "#f59f00"),
    System("fp16", "FP16", "FP16 (uncompressed)", "stream", "fp16", "#868e96"),
    System("local", "Local", "Local (no cache)", "local", None, "#2b8a3e"),
    System("oracle", "Oracle", "Oracle (cache on device)", "oracle", "fp16", "#212529"),
)}
STREAMING: tuple[str, ...] = tuple(n for n, s in SYSTEMS.items() if s.streams)
UNCOMPRESSED = "fp16"  # streams the FP16 cache as it is
COMPRESSED: tuple[str, ...] = tuple(n for n in STREAMING if n != UNCOMPRESSED)  # the quality-vs-bytes contenders
# The system under study: every baseline is compared against it, and its pack is the one a device prefetches
# when a template is picked. Code that singles it (or the floor) out names these, never the strings.
OURS = "sakura"
FLOOR = next(n for n, s in SYSTEMS.items() if s.holds_cache)
COMPRESSED_BASELINES: tuple[str, ...] = tuple(n for n in COMPRESSED if n != OURS)

# Ablation rows of the benchmark (a system with its policy or pack changed): labels and colours only.
VARIANTS: dict[str, tuple[str, str]] = {
    "sakura-coarse": ("SAKURA (per-step)", "#f783ac"),
    "sakura-fixed8": ("SAKURA (fixed 8-bit)", "#9c36b5"),
    "sakura+prefetch": ("SAKURA + prefetch", "#a61e4d"),  # cache fetched during the think time (--think-time)
    "sakura-no-fallback": ("SAKURA (no fallbacks)", "#f76707"),
    "sakura-paper": ("SAKURA (paper runtime)", "#adb5bd"),  # no anytime shards, no fallbacks
    "sakura-v1": ("SAKURA v1 pack", "#5f3dc4"),  # issue #18's before: uniform bits, raw planes
    "sakura+rule": ("SAKURA (per-unit window rule)", "#e64980"),  # the rule before the plan (--window-rule)
}


class UnknownSystemError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get_system(name: str) -> System:
    if name not in SYSTEMS:
        raise UnknownSystemError(f"unknown system {name!r}; choose one of {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def label(name: str) -> str:
    """Table / plot label of a system or an ablation variant (the name itself if unknown)."""
    if name in SYSTEMS:
        return SYSTEMS[name].label
    return VARIANTS.get(name, (name, ""))[0]


def color(name: str) -> str:
    if name in SYSTEMS:
        return SYSTEMS[name].color
    return VARIANTS.get(name, ("", "#495057"))[1]
