"""What one shard's level is worth to the output: one edit run on the simulated clock as the bench runs it, then
its cache rebuilt from the levels it used with one shard at a time raised to the smallest level of at most half its
error, and the masked PSNR of each such output (issue #32, session 23).

    python docs/results/issue32/policy3/shard_sensitivity.py --workload vton --template vton-grace-hopper \\
        --request 2 --start 415.1 --trace ../shared/traces/4g5g-mixed-600s.csv \\
        --calibration docs/results/issue32/headline/calibration.json [--packs DIR]
"""

from one_session import edit_arguments, prepared, session_at

from sakura.eval import bench
from sakura.eval.bench import edit_input


def main() -> None:
    a = edit_arguments().parse_args()
    p, scaled = prepared(a)
    session = session_at(p, scaled, a.start)
    report = session.edit(edit_input(p, a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"])
    used = {u.unit: u.level for u in report.timeline.units}
    enc = session.encoding.fresh()

    def masked_psnr(labels: dict[int, str]) -> float:
        kv = {}
        for unit in enc.units:
            priced = enc.priced(unit)
            level = next(lv for lv in priced.levels if lv.label == labels[unit.index])
            parts = session.source.fetch_timed(session.file_id, enc.ranges(priced, level)).parts
            kv.update(enc.decode(priced, level, parts))
        image = session.model.masked_edit(report.request, lambda step, layer: kv[(step, layer)]).image
        return session.quality(image, report.request, a.request)["psnr_masked"]

    print(f"run: {report.timeline.latency_s:.3f} s, masked PSNR {report.quality['psnr_masked']:.2f} dB "
          f"(rebuilt from its levels: {masked_psnr(used):.2f})")
    print("| shard | level used | error | raised to | error | + kB | masked PSNR (dB) |\n|---|---|---|---|---|---|---|")
    for unit in enc.units:
        errors = {lv.label: lv for lv in unit.levels}
        own = errors[used[unit.index]]
        better = sorted((lv for lv in unit.levels if lv.error <= own.error / 2), key=lambda lv: lv.nbytes)
        if not better:
            continue
        up = better[0]
        psnr = masked_psnr({**used, unit.index: up.label})
        print(f"| {unit.needed_by} | {own.label} | {own.error:.4f} | {up.label} | {up.error:.4f} | "
              f"{(up.nbytes - own.nbytes) / 1e3:.0f} | {psnr:.2f} |")


if __name__ == "__main__":
    main()
