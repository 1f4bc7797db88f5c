"""The pace and ETA from recorded buckets, against a brute force over the moves themselves."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.pace import BUCKET_SECONDS, RUNNING_SECONDS, Worker, add, pace


def _record(moves: list[tuple[float, int]], *, window: float) -> dict[int, int]:
    buckets: dict[int, int] = {}
    for t, n in moves:
        buckets = add(buckets, t, n, window=window)
    return buckets


@pytest.mark.parametrize("seed", range(20))
def test_the_pace_is_every_move_of_the_window_over_the_time_it_spans(seed):
    """Random shards, some side by side and some one after another (restarts): the pace is the
    points all of them moved in the window over the window's span since the first of them began,
    to within the bucket at the window's edge; the window ends at the last write of a process
    still running."""
    rng = np.random.default_rng(seed)
    window, now = 600.0, 10_000.0
    workers, moves_all, starts = [], [], []
    for _ in range(rng.integers(1, 5)):
        start = float(rng.uniform(now - 1500, now - 50))
        end = float(min(now, start + rng.uniform(30, 1500)))
        times = np.sort(rng.uniform(start, end, size=rng.integers(5, 60)))
        moves = [(float(t), int(rng.integers(1, 500))) for t in times]
        workers.append(Worker(started=start, updated=end, buckets=_record(moves, window=window)))
        moves_all += moves
        starts.append(start)
    remaining = int(rng.integers(0, 100_000))
    got = pace(workers, now=now, remaining=remaining, window=window)
    # the span ends at the last write of a process still running (else now)
    live = [w.updated for w in workers if now - w.updated <= RUNNING_SECONDS]
    now = max(live, default=now)
    recent = [(t, n) for t, n in moves_all if now - window < t <= now]
    if not recent:
        assert got.points_per_second is None
        return
    edge = [(t, n) for t, n in moves_all if now - window - BUCKET_SECONDS < t <= now - window]
    first = min(
        s
        for s, w in zip(starts, workers, strict=True)
        if any(k + BUCKET_SECONDS > now - window for k in w.buckets)
    )
    span = now - max(now - window, first)
    low = sum(n for _, n in recent) / span
    high = (sum(n for _, n in recent) + sum(n for _, n in edge)) / span
    assert low - 1e-9 <= got.points_per_second <= high + 1e-9
    assert got.eta_seconds == pytest.approx(remaining / got.points_per_second)


def test_shards_side_by_side_add_up_and_a_restart_does_not():
    now = 1000.0
    a = Worker(
        started=400.0, updated=1000.0, buckets=_record([(t, 10) for t in range(401, 1000, 1)], window=600)
    )
    b = Worker(
        started=400.0, updated=1000.0, buckets=_record([(t, 10) for t in range(401, 1000, 1)], window=600)
    )
    assert pace([a], now=now, remaining=0).points_per_second == pytest.approx(10, rel=0.02)
    assert pace([a, b], now=now, remaining=0).points_per_second == pytest.approx(20, rel=0.02)
    before = Worker(
        started=400.0,
        updated=700.0,
        buckets=_record([(t, 10) for t in range(401, 700)], window=600),
        ended=True,
    )
    after = Worker(
        started=700.0, updated=1000.0, buckets=_record([(t, 10) for t in range(701, 1000)], window=600)
    )
    both = pace([before, after], now=now, remaining=9000)
    assert both.points_per_second == pytest.approx(10, rel=0.02)
    assert both.eta_seconds == pytest.approx(900, rel=0.02)
    assert both.running == 1  # the run that ended is not running


def test_no_move_in_the_window_means_no_pace_and_no_eta_unless_nothing_remains():
    stale = Worker(started=0.0, updated=100.0, buckets={0: 500, 90: 500})
    assert pace([stale], now=2000.0, remaining=10).eta_seconds is None
    assert pace([stale], now=2000.0, remaining=0).eta_seconds == 0.0
    assert pace([], now=2000.0, remaining=10).points_per_second is None
    assert pace([stale], now=100.0 + RUNNING_SECONDS + 1, remaining=10).running == 0


def test_old_buckets_are_dropped_as_the_window_slides():
    buckets = _record([(0.0, 5), (300.0, 5), (900.0, 5)], window=600)
    assert sorted(buckets) == [300, 900]


def test_a_young_run_is_paced_from_its_first_batch_not_from_its_start():
    """The first batch waits for the whole pipeline (claim, fetch, decode, encode, write); then a
    batch settles every second. Read after 10 batches, the pace is the steady one."""
    moves = [(5.0 + i, 100) for i in range(11)]
    worker = Worker(started=0.0, updated=15.0, buckets=_record(moves, window=600), first=5.0, first_moved=100)
    got = pace([worker], now=15.0, remaining=1000)
    assert got.points_per_second == pytest.approx(100.0)
    assert got.eta_seconds == pytest.approx(10.0)
    one = Worker(started=0.0, updated=5.0, buckets=_record(moves[:1], window=600), first=5.0, first_moved=100)
    assert pace([one], now=5.0, remaining=10).points_per_second is None  # one batch: no pace yet
