"""Pacing checks that hold on a busy machine: a paced transfer may take longer than its trace says (a loaded
CPU wakes its sleepers late), never noticeably less; a hang is pytest's timeout. How closely pacing follows a
trace on an idle machine is measured, not asserted: `python -m sakura.eval.pacing_bench`."""

FASTEST = 0.85  # a transfer may beat its trace by the bucket's first 16 KiB and timer grain, no more


def assert_paced(took: float, expected: float) -> None:
    assert took >= FASTEST * expected, f"{took:.3f} s: faster than the trace allows ({expected:.3f} s)"
