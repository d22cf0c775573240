"""Per-system statistics of a sweep's edit records: latency percentiles (pooled and paired with the
oracle's edit at the same offset), stalls, bytes, quality, storage, and the fallbacks that fired."""

from __future__ import annotations

import numpy as np

from sakura.systems import SYSTEMS


def summarize(records: list[dict], storage: dict[str, float]) -> dict:
    by_system: dict[str, list[dict]] = {}
    for r in records:
        by_system.setdefault(r["system"], []).append(r)
    oracle = {edit_key(r): r["latency_s"] for r in by_system.get("oracle", [])}
    out = {}
    for system, rs in by_system.items():
        lat = [r["latency_s"] for r in rs]
        out[system] = {
            **paired_over_oracle(rs, oracle),
            "n": len(rs),
            "latency_p50_s": float(np.percentile(lat, 50)), "latency_p90_s": float(np.percentile(lat, 90)),
            "latency_mean_s": float(np.mean(lat)),
            "stall_s_mean": float(np.mean([r["stall_s"] for r in rs])),
            "deadline_miss_rate": float(np.mean([r["deadline_misses"] / max(1, r["shards"]) for r in rs])),
            # share of fetch units execution consumed before all of them arrived (anytime shards)
            "anytime_cut_rate": float(np.mean([r.get("cuts", 0) / max(1, r.get("units", 0)) for r in rs])),
            "bytes_mean": float(np.mean([r["bytes"] for r in rs])),
            "psnr_mean": float(np.mean([r["psnr"] for r in rs])), "ssim_mean": float(np.mean([r["ssim"] for r in rs])),
            "psnr_masked_mean": float(np.mean([r["psnr_masked"] for r in rs])),
            "ssim_masked_mean": float(np.mean([r["ssim_masked"] for r in rs])),
            "psnr_p10": float(np.percentile([r["psnr"] for r in rs], 10)),
            "ssim_p10": float(np.percentile([r["ssim"] for r in rs], 10)),
            # what the system's stored format costs per template (oracle: the FP16 cache it already holds)
            "storage_bytes": float(storage.get(SYSTEMS[system].format, 0.0) if system in SYSTEMS else 0.0),
            "device_peak_cache_bytes": int(max(r["peak_cache_bytes"] for r in rs)),
            **fallback_stats(rs),
        }
    return out


def edit_key(r: dict) -> tuple:
    return r["template"], r["request"], round(r["start_s"], 6)


def paired_over_oracle(rs: list[dict], oracle: dict) -> dict:
    """p50 / p90 of each edit's latency over the oracle's for the same template, request and offset.
    Pooled percentiles mix templates whose floors differ (vton: 0.87 vs 1.00 s), so a pooled p50 ratio
    can sit 5 % off while every edit is within 3 % of its own floor; the paired ratio cannot."""
    ratios = [r["latency_s"] / oracle[edit_key(r)] for r in rs if oracle.get(edit_key(r))]
    if not ratios:
        return {}
    return {"over_oracle_p50": float(np.percentile(ratios, 50)), "over_oracle_p90": float(np.percentile(ratios, 90))}


def fallback_stats(rs: list[dict]) -> dict:
    """Fallbacks fired per edit by kind, the share of edits with any, and the masked PSNR of edits
    with and without them (None where there are none)."""
    kinds = sorted({k for r in rs for k in r.get("fallbacks", {})})
    fired = [r for r in rs if sum(r.get("fallbacks", {}).values())]
    calm = [r for r in rs if not sum(r.get("fallbacks", {}).values())]

    def masked(group):
        return float(np.mean([r["psnr_masked"] for r in group])) if group else None

    return {"fallbacks_mean": {k: float(np.mean([r.get("fallbacks", {}).get(k, 0) for r in rs])) for k in kinds},
            "fallback_rate": len(fired) / max(1, len(rs)),
            "psnr_masked_with_fallbacks": masked(fired), "psnr_masked_without_fallbacks": masked(calm)}
