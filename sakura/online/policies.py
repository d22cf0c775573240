"""Transfer policies: SAKURA and every streaming baseline, as plug-ins over the same runtime and link.

Every adaptive policy sees the same monitor (rate R̂ from bytes / active receive time) and the
same deadline (when execution will need the unit, predicted from measured shard compute times
and current progress). The transfer window is ``γ · (deadline − now)``, which is the paper's
``γ · (T_ovlp + H_{p−1})``: the compute left before the unit is needed plus the lead carried over
from earlier early arrivals.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from sakura.formats import FetchUnit, Level
from sakura.online.monitor import RuntimeMonitor

DEFAULT_GAMMA = 0.8


@dataclass
class Decision:
    level: Level
    rate_bps: float
    window_s: float
    budget_bytes: float  # what the policy allowed itself; inf for non-adaptive policies
    fits: bool  # the chosen level is within the budget


class Policy(ABC):
    """Picks a level for each fetch unit. Which stored format it reads is the system's (``sakura.systems``)."""

    name: str = ""

    def begin(self, units: list[FetchUnit], compute_s: float, initial_bps: float) -> None:
        """Called once per edit before the first request; ``compute_s`` = predicted masked compute."""
        self.units = units

    @abstractmethod
    def choose(self, unit: FetchUnit, now: float, deadline: float, monitor: RuntimeMonitor) -> Decision: ...


def best_within(levels: tuple[Level, ...], budget: float | Callable[[Level], float]) -> tuple[Level, bool]:
    """Lowest error among levels that fit ``budget`` (bytes, or each level's own bytes allowance);
    the smallest level if none fits (stall rather than skip)."""
    allowance = budget if callable(budget) else (lambda lv: budget)
    fitting = [lv for lv in levels if lv.nbytes <= allowance(lv)]
    if not fitting:
        return min(levels, key=lambda lv: lv.nbytes), False
    return min(fitting, key=lambda lv: (lv.error, lv.nbytes)), True


class WindowPolicy(Policy):
    """The best level whose bytes arrive within the transfer window γ·(deadline − now) at R̂; with
    ``price_rebuild``, within the window less the level's own predicted rebuild (``monitor.rebuild``,
    learnt from this edit's rebuilds), since a shard is needed rebuilt, not received."""

    def __init__(self, gamma: float = DEFAULT_GAMMA, price_rebuild: bool = False):
        self.gamma = gamma
        self.price_rebuild = price_rebuild

    def choose(self, unit, now, deadline, monitor):
        window = self.gamma * max(0.0, deadline - now)  # the transfer window γ·(deadline − now)

        def allowance(lv: Level) -> float:  # the bytes that arrive in time to leave lv's rebuild room
            rebuild_s = monitor.rebuild.seconds(lv.work) if self.price_rebuild else 0.0
            return monitor.rate_bps / 8 * (window - rebuild_s)

        level, fits = best_within(unit.levels, allowance)
        return Decision(level, monitor.rate_bps, window, allowance(level), fits)


class SakuraPolicy(WindowPolicy):
    """Per-shard budget = R̂ · γ(T_ovlp + H); best profiled (r, b_A, b_B) within it, less the level's
    rebuild: higher ranks cost more rebuild for the same bytes (``Level.work``). The paper's rule takes
    rebuild as free (``price_rebuild=False``)."""

    name = "sakura"

    def __init__(self, gamma: float = DEFAULT_GAMMA, price_rebuild: bool = True):
        super().__init__(gamma, price_rebuild)


class Fp16Policy(Policy):
    """The uncompressed FP16 cache, shard by shard."""

    name = "fp16"

    def choose(self, unit, now, deadline, monitor):
        return Decision(unit.levels[0], monitor.rate_bps, deadline - now, float("inf"), True)


class IntQPolicy(Policy):
    """One bit width for the whole edit, chosen from the initial bandwidth: the most bits whose whole
    cache transfers within the edit's compute time; INT2 at minimum (paper §6.1)."""

    name = "intq"

    def __init__(self, gamma: float = DEFAULT_GAMMA):
        self.gamma = gamma
        self.bits: str | None = None

    def begin(self, units, compute_s, initial_bps):
        super().begin(units, compute_s, initial_bps)
        budget = initial_bps / 8 * self.gamma * compute_s
        labels = sorted({lv.label for u in units for lv in u.levels},
                        key=lambda lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab))
        total = {lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab) for lab in labels}
        fitting = [lab for lab in labels if total[lab] <= budget]
        self.bits = fitting[-1] if fitting else labels[0]

    def choose(self, unit, now, deadline, monitor):
        level = next(lv for lv in unit.levels if lv.label == self.bits)
        return Decision(level, monitor.rate_bps, deadline - now, float("inf"), True)


class CacheGenPolicy(WindowPolicy):
    """CacheGen's adaptation: pick each unit's stored level from the measured throughput so
    that it arrives before it is needed. CacheGen decides per token chunk of an LLM prefix; a DiT edit
    consumes its cache shard by shard, so here the unit is a shard (the same one SAKURA fetches) and
    the rule is SAKURA's: the best stored level within R̂ · γ · (deadline − now), same monitor, γ and
    look-ahead. Level sizes are as priced by the encoding, so a level whose tables this edit has not
    fetched yet carries their bytes. Its decode is not priced by default (CacheGen's own rule;
    ``price_rebuild=True`` prices it by bytes: ``sakura bench --figure rebuild-pricing``)."""

    name = "cachegen"


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (SakuraPolicy, Fp16Policy, IntQPolicy, CacheGenPolicy)}


def get_policy(name: str, **kw) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"no streaming policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](**kw)
