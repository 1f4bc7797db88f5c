"""What bounds a migration on the embedded store: the work qdrant-edge does with Python's GIL held.

    python benchmarks/gil_floor.py [--n 10000] [--batch 1000] [--repeats 3] [--out FILE]

1. **Does qdrant-edge release the GIL?** A Python thread counts while the main thread makes each
   kind of shard call on a 20,000-point shard; its pace then, against its pace while the main
   thread sleeps. About 0 %: the call holds the GIL, and no other Python thread of the process
   (fetch, decode, the encoder's caller, the writer) runs meanwhile.
2. **How much of a migration is that work?** ``rmq migrate``'s own engine (run_migration) moves
   ``--n`` CIFAR-10 JPEGs with an encoder that does almost nothing, in each layout, with every
   qdrant-edge call timed in CPU time of the thread that makes it (``time.thread_time``): the
   shard's calls, the objects built for them (points, vectors, filters, operations) and the
   conversion of what they return (ids, payloads and vectors are read inside the timer), and
   printed by kind of call. The timer's own cost, measured first, is taken off; so is the index
   build at the run's end, which the rate leaves out too. ``limit``: 1e6 / that CPU time a point, the
   most points a second any pipeline in one process can settle while qdrant-edge holds the GIL
   that long a point, whatever else it overlaps.
3. **What the two cores allow an encoder.** For the tiny CNN and the CNN of ResNet-18's cost:
   the encoder alone (migration's session options, pre-decoded pixels) and its process CPU time
   a point; reading and decoding a JPEG, CPU time a point (one thread); and the bound on
   migration / encoder alone that follows: a point needs the encoder's CPU, the decode's and
   qdrant-edge's (at the least), and the cores give ``cores`` CPU seconds a second.

The figures of issue 26's goals are printed beside each bound. The report goes to ``--out``
(default benchmarks/results/gil_floor.md) with the 1-minute load average beside every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import qdrant_edge as qe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import migration_throughput as bench  # noqa: E402
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.convnet import NULL, RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import OnnxEncoder, scan_image_folder  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, run_migration  # noqa: E402
from rm_qdrant.pair.record import LAYOUTS  # noqa: E402
from rm_qdrant.store import edge, edge_query, qfilter  # noqa: E402

#: Issue 26's goals on this 2-core machine: ceiling points/s by layout, ratio by encoder.
GOALS = {"paired": 8_000, "single-collection": 12_000, "small": 0.7, "resnet18-size": 0.95}
ENCODERS = {
    "small": ("tiny CNN (~6 M multiply-adds)", SMALL),
    "resnet18-size": ("CNN of ResNet-18's cost", RESNET18_SIZE),
}


# -- 1. the GIL during each kind of call ------------------------------------------------------


def gil_paces(points: int = 20_000) -> dict[str, float]:
    """A counting thread's pace while the main thread makes each call, over its pace at rest."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((points, 128)).astype(np.float32).tolist()
    body = {"uri": "/data/train/cat/00001.jpg", "label": "cat"}
    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    with tempfile.TemporaryDirectory(prefix="rmq-gil-") as tmp:
        shard = qe.EdgeShard.create(
            tmp, qe.EdgeConfig(vectors={"v": qe.EdgeVectorParams(128, qe.Distance.Cosine)})
        )
        made = [qe.Point(i, {"v": r}, body) for i, r in enumerate(rows)]
        again = [qe.Point(points + i, {"v": r}, body) for i, r in enumerate(rows)]
        query = qe.QueryRequest(query=qe.Query.Nearest(rows[0], using="v"), limit=10, with_payload=True)
        calls = {
            "rest (main thread sleeps)": lambda: time.sleep(0.3),
            "update (upsert 20,000 points)": lambda: shard.update(qe.UpdateOperation.upsert_points(again)),
            "retrieve (20,000 with payload)": lambda: shard.retrieve(list(range(points)), True, False),
            "scroll (20,000 with payload)": lambda: shard.scroll(
                qe.ScrollRequest(limit=points, with_payload=True)
            ),
            "optimize (build the HNSW index)": shard.optimize,
            "query (300 searches)": lambda: [shard.query(query) for _ in range(300)],
            "update (delete 20,000 points)": lambda: shard.update(
                qe.UpdateOperation.delete_points(list(range(points)))
            ),
        }
        shard.update(qe.UpdateOperation.upsert_points(made))
        paces = {}
        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
        time.sleep(0.1)
        for name, call in calls.items():
            before, start = count[0], time.perf_counter()
            call()
            paces[name] = (count[0] - before) / (time.perf_counter() - start)
        stop.set()
        thread.join()
        shard.close()
    rest = paces.pop("rest (main thread sleeps)")
    return {name: pace / rest for name, pace in paces.items()}


# -- 2. qdrant-edge's CPU time in a migration --------------------------------------------------


class Clock:
    """CPU time spent in qdrant-edge calls, all threads, while ``on``; less the timer's own cost
    and that of the small object each returned point is copied into (``_plain``)."""

    def __init__(self) -> None:
        self.on, self.lock = False, threading.Lock()
        self.spent: dict[str, list[float]] = {}  # kind of call -> [seconds, calls, points returned]
        self.overhead = self._overhead()
        self.record_overhead = self._record_overhead()

    @staticmethod
    def _overhead(n: int = 100_000) -> float:
        """What the timer reads around a call that does nothing."""
        spent = 0.0
        for _ in range(n):
            start = time.thread_time()
            spent += time.thread_time() - start
        return spent / n

    @staticmethod
    def _record_overhead(n: int = 100_000) -> float:
        """What ``_plain`` costs a point beyond the binding's own conversion (plain values in)."""
        points = [SimpleNamespace(id=i, payload={}, vector=None) for i in range(n)]
        start = time.thread_time()
        [_plain(p) for p in points]
        return (time.thread_time() - start) / n

    def timed(self, call, kind: str, convert: bool = False):  # noqa: ANN001, ANN201
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not self.on:
                return call(*args, **kwargs)
            start = time.thread_time()
            out = call(*args, **kwargs)
            records = 0
            if convert:
                out, records = _converted(out)
            spent = time.thread_time() - start
            with self.lock:
                figures = self.spent.setdefault(kind, [0.0, 0, 0])
                figures[0] += spent
                figures[1] += 1
                figures[2] += records
            return out

        return run

    def reset(self) -> None:
        self.spent = {}

    def kinds(self, points: int) -> dict[str, float]:
        """Seconds a point in each kind of call, less the timer's and ``_plain``'s own cost."""
        net = {
            kind: max(0.0, seconds - calls * self.overhead - records * self.record_overhead) / points
            for kind, (seconds, calls, records) in self.spent.items()
        }
        return dict(sorted(net.items(), key=lambda item: -item[1]))


def _plain(record):  # noqa: ANN001, ANN202
    """A returned point read whole (the binding converts each field when it is read)."""
    return SimpleNamespace(
        id=record.id, payload=record.payload, vector=record.vector, score=getattr(record, "score", None)
    )


def _converted(out):  # noqa: ANN001, ANN202
    """What a shard call returned, each point read whole; and how many points that was."""
    if isinstance(out, tuple):  # scroll: (points, next offset)
        return ([_plain(p) for p in out[0]], out[1]), len(out[0])
    if isinstance(out, list) and out and isinstance(out[0], list):  # query_batch
        return [[_plain(p) for p in hits] for hits in out], sum(map(len, out))
    if isinstance(out, list):
        return [_plain(p) for p in out], len(out)
    return out, 0


class _Timed:
    """Stands in for a qdrant-edge class or module: each call through it is timed."""

    def __init__(self, target, clock: Clock) -> None:  # noqa: ANN001
        self._target, self._clock = target, clock

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        return self._clock.timed(self._target, self._target.__name__)(*args, **kwargs)

    def __getattr__(self, name: str):  # noqa: ANN204
        value = getattr(self._target, name)
        if isinstance(value, type) or (callable(value) and not isinstance(self._target, type)):
            return _Timed(value, self._clock)
        if callable(value):  # a class's static constructor, qe.UpdateOperation.upsert_points, say
            return self._clock.timed(value, f"{self._target.__name__}.{name}")
        return value


class _Shard:
    """A shard whose calls are timed, with what they return converted inside the timer."""

    def __init__(self, shard, clock: Clock) -> None:  # noqa: ANN001
        self._shard, self._clock = shard, clock

    def __getattr__(self, name: str):  # noqa: ANN204
        value = getattr(self._shard, name)
        return self._clock.timed(value, f"shard.{name}", convert=True) if callable(value) else value


def instrument(clock: Clock) -> None:
    """Route the embedded store's qdrant-edge calls through ``clock``."""
    proxy = _Timed(qe, clock)
    for module in (edge, edge_query, qfilter):
        module.qe = proxy
    opened = edge.EdgeStore._open

    def _open(self, name):  # noqa: ANN001, ANN202
        specs, shard = opened(self, name)
        if not isinstance(shard, _Shard):
            shard = _Shard(shard, clock)
            self._shards[name] = (specs, shard)
        return specs, shard

    edge.EdgeStore._open = _open


def migrations(store, folder: Path, args: argparse.Namespace, clock: Clock) -> dict[str, list[dict]]:  # noqa: ANN001
    model = convnet_encoder(folder / "ceiling.onnx", heads=bench.NEW_HEADS, stages=NULL, seed=2)
    runs: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    for repeat in range(args.repeats):
        for layout in LAYOUTS[repeat % 2 :] + LAYOUTS[: repeat % 2]:
            index = bench.copy_gallery(store, model, f"c{repeat}-{layout}", layout)
            clock.reset()
            clock.on = True
            cpu = time.process_time()
            report = run_migration(index, MigrateOptions(batch=args.batch, optimize_every=None))
            cpu, clock.on = time.process_time() - cpu, False
            seconds = report.seconds - report.optimize_seconds
            # the index build at the end is not in the rate (report.optimize_seconds): nor here
            kinds = {k: us * 1e6 for k, us in clock.kinds(report.moved).items() if k != "shard.optimize"}
            runs[layout].append(
                {
                    "rate": report.moved / seconds,
                    "cpu_us": cpu / report.moved * 1e6,
                    "binding_us": sum(kinds.values()),
                    "kinds": kinds,
                    "wall_us": seconds / report.moved * 1e6,
                    "load": os.getloadavg()[0],
                }
            )
            shown = {k: v for k, v in runs[layout][-1].items() if k != "kinds"}
            print(f"  {layout} run {repeat + 1}: {shown}; {kinds}", flush=True)
    return runs


# -- 3. what the cores allow an encoder --------------------------------------------------------


def decode_cpu(items: list, model: Path, passes: int = 3) -> float:
    """CPU time a point of reading and decoding a JPEG to the encoder's input, one thread (the
    files already read once: the page cache holds them, as in the migrations); the fastest pass."""
    decoder = OnnxEncoder(model)
    spent = []
    for _ in range(passes):
        start = time.thread_time()
        for item in items:
            decoder.decode(item.uri)
        spent.append(time.thread_time() - start)
    return min(spent) / len(items)


def encoder_cpu(model: Path, pixels: np.ndarray, batch: int) -> tuple[float, float]:
    """The encoder alone (migration's session options): points a second, process CPU a point."""
    encoder = OnnxEncoder(model)
    bench.encoder_alone(encoder, pixels[:batch], batch)  # the session warmed up
    cpu = time.process_time()
    rate = bench.encoder_alone(encoder, pixels, batch)
    used = min(len(pixels), max(5_000, len(pixels) // 4))
    return rate, (time.process_time() - cpu) / used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="images to migrate (CIFAR-10 train)")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gil_floor.md")
    args = parser.parse_args()
    paces = gil_paces()
    print(f"  GIL: {paces}", flush=True)
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    clock = Clock()
    instrument(clock)
    with tempfile.TemporaryDirectory(prefix="rmq-gilfloor-") as tmp:
        folder = Path(tmp)
        store = bench.indexed_gallery(folder, items, args.batch)
        runs = migrations(store, folder, args, clock)
        store.close()
        encoders = {}
        for key, (_, stages) in ENCODERS.items():
            model = convnet_encoder(folder / f"{key}.onnx", heads=bench.NEW_HEADS, stages=stages, seed=2)
            decoder = OnnxEncoder(model)
            pixels = np.stack([decoder.decode(item.uri) for item in items])
            rate, cpu = encoder_cpu(model, pixels, args.batch)
            encoders[key] = {
                "rate": rate,
                "cpu": cpu,
                "decode": decode_cpu(items[:2_000], model),
                "load": os.getloadavg()[0],
            }
            print(f"  {key}: {encoders[key]}", flush=True)
    args.out.write_text(report(args, paces, runs, encoders, (clock.overhead, clock.record_overhead)))
    print(args.out.read_text())


def report(args, paces, runs, encoders, overhead) -> str:  # noqa: ANN001
    cores = os.cpu_count() or 1
    lines = [
        f"command: python benchmarks/gil_floor.py --n {args.n} --batch {args.batch} --repeats {args.repeats}",
        f"machine: {machine()}; date: {date.today()}",
        f"timer cost taken off: {overhead[0] * 1e6:.2f} µs a call, "
        f"{overhead[1] * 1e6:.2f} µs a returned point",
        "",
        "## 1. A Python thread's pace while qdrant-edge works (against the main thread asleep)",
        "",
        "| call on a 20,000-point shard | pace of another Python thread |",
        "|---|--:|",
        *(f"| {name} | {pace:.1%} |" for name, pace in paces.items()),
        "",
        "## 2. qdrant-edge's CPU time in a migration (encoder that does almost nothing)",
        "",
        f"{args.n:,} CIFAR-10 JPEGs, batch {args.batch}, embedded store, run_migration; median of "
        f"{args.repeats} runs (layouts alternate first). qdrant-edge: the CPU time of every call into it, "
        "with the GIL held. limit: 1e6 / that, the most points a second the process can settle.",
        "",
        "| layout | migration | wall a point | CPU a point (all threads) | qdrant-edge CPU a point | "
        "its share of the wall | limit | goal | load |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    binding = {}
    for layout, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "kinds"}
        binding[layout] = med["binding_us"]
        lines.append(
            f"| {layout} | {med['rate']:,.0f} points/s | {med['wall_us']:.0f} µs | {med['cpu_us']:.0f} µs | "
            f"{med['binding_us']:.0f} µs | {med['binding_us'] / med['wall_us']:.0%} | "
            f"{1e6 / med['binding_us']:,.0f} points/s | {GOALS[layout]:,} points/s | "
            f"{min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f} |"
        )
    lines += [
        "",
        "qdrant-edge's CPU a point by kind of call (median of the runs; the largest first):",
        "",
        "| layout | " + " | ".join(f"{i}." for i in range(1, 7)) + " |",
        "|---|" + "---|" * 6,
    ]
    for layout, rows in runs.items():
        kinds = {kind for r in rows for kind in r["kinds"]}
        med = {kind: statistics.median(r["kinds"].get(kind, 0.0) for r in rows) for kind in kinds}
        top = sorted(med.items(), key=lambda item: -item[1])[:6]
        lines.append(f"| {layout} | " + " | ".join(f"{kind} {us:.0f} µs" for kind, us in top) + " |")
    lines += [
        "",
        f"## 3. What {cores} cores allow an encoder: migration / encoder alone at most",
        "",
        "A point needs at least the encoder's CPU (process CPU of the encoder alone, a point), "
        "the decode's (read and decode one JPEG, one thread) and qdrant-edge's (section 2). "
        f"bound: {cores} cores / that sum, over the encoder alone, and no more than section 2's limit.",
        "",
        "| encoder | layout | encoder alone | its CPU a point | decode CPU a point | "
        "qdrant-edge CPU a point | bound on the ratio | goal | load |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, enc in encoders.items():
        for layout, spent in binding.items():
            per_point = enc["cpu"] * 1e6 + enc["decode"] * 1e6 + spent
            bound = min(cores * 1e6 / per_point, 1e6 / spent) / enc["rate"]
            lines.append(
                f"| {ENCODERS[key][0]} | {layout} | {enc['rate']:,.0f} points/s | {enc['cpu'] * 1e6:.0f} µs "
                f"| {enc['decode'] * 1e6:.0f} µs | {spent:.0f} µs | {min(bound, 1.0):.2f} | {GOALS[key]} "
                f"| {enc['load']:.1f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
