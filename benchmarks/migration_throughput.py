"""Migration throughput against the encoder's own throughput, in one run.

Indexes CIFAR-10 JPEGs (real files from ../shared/data) into an old collection of the
embedded store, then, for each encoder, on the same images and batch size:

- the encoder alone: ONNX Runtime over pre-decoded batches (no I/O at all), with the
  migration's own session options (``OnnxEncoder(model)``: ONNX Runtime's threads do not
  spin between calls) and with spinning threads (ONNX Runtime's default, its best with the
  machine to itself); the ratio divides by the first (the same encoder the migration runs),
  and ``vs best`` by the faster of the two;
- ``rmq migrate``'s engine on a fresh pair of that gallery: fetch + decode + encode +
  Qdrant writes, end to end, in each ``--layout``: ``paired`` (a copy of the old collection,
  points moved to a new collection) and ``single-collection`` (a copy of the old collection
  that gets the named vector ``new``; migrating a point adds it). With both, each repeat
  migrates in both layouts, one after the other, who goes first alternating per repeat.

Encoders (benchmarks/convnet.py, random weights): a CNN of ResNet-18's cost (~300 M
multiply-adds per 32x32 image), a tiny CNN (~6 M), and for the pipeline's ceiling one
that does almost nothing (pooling and a matrix product), which is what the CPU side of a
backfill sees when the model runs on a GPU. Each figure is the median of ``--repeats``
runs; the encoder alone is measured right before and after each migration and averaged,
so drift on a shared machine hits both sides alike. The 1-minute load average is printed
beside every figure (``os.getloadavg()``): on a machine shared with other work, a figure
taken at load 6 on 2 cores says little about an idle one. ``migration`` is the pipeline's
rate; ``with index builds`` adds the embedded store's optimisations the run does (at its
end, and every ``optimize_every`` seconds: rm_qdrant/pair/upkeep.py), which the encoder
alone does not do.

``--engine`` picks ``rmq migrate``'s engine: ``local`` (the default: the figures above, as
before), ``ray`` or ``both`` (``--encoders N`` encoder actors, ``--decoders M`` decode tasks at
once; 2 and 2 by default). With ``ray`` or ``both`` the encoder alone is not measured; per
encoder the script measures instead:

- Ray's start-up, apart: from no Ray to a local Ray whose encoder actors have answered (the
  RayEngine run_migration makes, ray.init inside, then a chunk decoded and encoded by each
  actor, which loads its session), a warm round trip, and the close;
- one run from no Ray (run_migration starts Ray and shuts it down: what a user of
  ``rmq migrate --engine ray`` waits for), its wall seconds;
- then, on a local Ray started once in this process (``ray.init(num_cpus=max(cores,
  encoders + decoders), include_dashboard=False)``, which run_migration reuses), the start-up
  round trip again (``with Ray up``: the actors' processes start and load their sessions, what
  each run pays; it also warms Ray's pool of worker processes up), then ``--repeats``
  runs of each engine (``both``: local and ray, each on a fresh copy of the gallery, who goes
  first alternating), their ``ray / local`` throughput ratio, also after the first batch (the
  pipeline filled: each Ray run creates its actors, whose processes start in it);
- where the time goes: RayMigrator._claim, RayEngine.dispatch and .gather (and their
  ray.wait/ray.get), Migrator._settle (and the local engine's _prepare and _encode) wrapped with
  timers in this process, and the Ray workers' decode tasks, encoder calls and session loads
  (wrapped in subclasses this script defines, which Ray pickles by value: run it as a script).

Its report goes to ``--out`` (default benchmarks/results/migration_throughput-ray.md), with the
1-minute load average before and after each run.

Run: ``python benchmarks/migration_throughput.py [--n 20000] [--batch 1000] [--repeats 3]
[--layout paired|single-collection|both] [--engine local|ray|both] [--encoders 2]
[--decoders 2] [--out FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.convnet import NULL, RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.migration import ray_engine  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, Migrator, run_migration  # noqa: E402
from rm_qdrant.migration.ranking import plan, prepare_order, read_all  # noqa: E402
from rm_qdrant.migration.ray_engine import RayEngine, RayMigrator, RayOptions  # noqa: E402
from rm_qdrant.pair.record import LAYOUTS, PAIRED, SINGLE  # noqa: E402
from rm_qdrant.sources import ImageSource, SourceConfig  # noqa: E402
from rm_qdrant.store import Where  # noqa: E402

MODELS = {
    "resnet18-size": ("CNN of ResNet-18's cost (~300 M multiply-adds)", RESNET18_SIZE),
    "small": ("tiny CNN (~6 M multiply-adds)", SMALL),
    "ceiling": ("pipeline ceiling: an encoder that does almost nothing", NULL),
}
RESULTS = ROOT / "benchmarks" / "results"
STAGES = ("fetch, decode and store reads", "encode", "store writes and read-backs")


def encoder_alone(encoder: OnnxEncoder, pixels: np.ndarray, batch: int) -> float:
    pixels = pixels[: max(5_000, len(pixels) // 4)]  # a steady rate needs no more
    start = time.perf_counter()
    for i in range(0, len(pixels), batch):
        encoder.run_pixels(pixels[i : i + batch], ["new"])
    return len(pixels) / (time.perf_counter() - start)


def copy_gallery(store, model: Path, name: str, layout: str = PAIRED) -> DualIndex:
    """A fresh copy of the gallery's old collection, paired with ``model`` in ``layout`` (in one
    collection: the new vector ``new`` added to the copy), its order prepared (untimed)."""
    ids, payloads, vectors = read_all(store, "gallery", Where(), True)
    store.create_collection(f"{name}-old", dim=vectors.shape[1], distance="cosine")
    store.upsert(f"{name}-old", ids, vectors, payloads)
    new_vector = "new" if layout == SINGLE else None
    encoder = OnnxEncoder(model)
    create_pair(
        store, name, old_collection=f"{name}-old", encoder=encoder, layout=layout, new_vector=new_vector
    )
    index = DualIndex.open(store, name)
    index.pair = prepare_order(store, index.pair, "random")  # `rmq migrate --prepare`
    return index


def load() -> float:
    """The 1-minute load average, read beside each figure."""
    return os.getloadavg()[0]


def one_run(store, model: Path, name: str, pixels: np.ndarray, args: argparse.Namespace, layout: str) -> dict:
    """The gallery migrated whole on a fresh pair in ``layout``; the encoder alone measured around
    it, with the migration's session options (``same``) and with spinning threads (``spin``)."""
    index = copy_gallery(store, model, name, layout)
    same, spin = OnnxEncoder(model), OnnxEncoder(model, spin=True)
    before = {
        "same": encoder_alone(same, pixels, args.batch),
        "spin": encoder_alone(spin, pixels, args.batch),
    }
    load_before, cpu = load(), time.process_time()
    report = run_migration(index, MigrateOptions(batch=args.batch, fetch_workers=args.fetch_workers))
    load_during, cpu = load(), time.process_time() - cpu
    after = {"spin": encoder_alone(spin, pixels, args.batch), "same": encoder_alone(same, pixels, args.batch)}
    assert report.moved == len(pixels) and report.failed == 0, report
    optimizing = getattr(report, "optimize_seconds", 0.0)  # the base of a before/after comparison lacks it
    return {
        "encoder": (before["same"] + after["same"]) / 2,
        "encoder_spin": (before["spin"] + after["spin"]) / 2,
        "migration": report.moved / (report.seconds - optimizing),
        "with_builds": report.moved / report.seconds,
        "cpu_us": cpu / report.moved * 1e6,  # all threads: what the run costs, whatever the load
        "load_encoder": (load_before + load()) / 2,
        "load_migration": load_during,
    }


def stage_costs(store, model: Path, name: str, args: argparse.Namespace, layout: str) -> dict[str, float]:
    """Microseconds a point spends in each stage when they run one after another, on one thread each."""
    index = copy_gallery(store, model, name, layout)
    migrator = Migrator(index, MigrateOptions(batch=args.batch, fetch_workers=1))
    ids = plan(store, index.pair, migrator.options)
    spent = dict.fromkeys(STAGES, 0.0)
    with ImageSource(SourceConfig()) as source, ThreadPoolExecutor(1) as fetch:
        for start in range(0, len(ids), args.batch):
            clock = [time.perf_counter()]
            prepared = migrator._prepare(ids[start : start + args.batch], source, fetch)
            clock.append(time.perf_counter())
            encoded = migrator._encode(prepared)
            clock.append(time.perf_counter())
            migrator._settle(prepared, encoded)
            clock.append(time.perf_counter())
            for stage, begin, end in zip(STAGES, clock, clock[1:], strict=False):
                spent[stage] += end - begin
    return {stage: seconds / len(ids) * 1e6 for stage, seconds in spent.items()}


#: The new models' outputs: ``new``, and ``rev`` = ψ(new) of the old model's size.
NEW_HEADS = {"new": ("features", 128), "rev": ("new", 64)}


def indexed_gallery(folder: Path, items: list, batch: int):  # noqa: ANN201
    """An embedded store in ``folder`` whose collection 'gallery' holds ``items`` by the old model."""
    old = OnnxEncoder(convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1))
    store = open_store(folder / "qdrant")
    index_images(store, "gallery", old, items, batch_size=batch)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="images to migrate (CIFAR-10 train)")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument(
        "--fetch-workers", type=int, default=None, help="fetch threads (default: the migration's own choice)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    parser.add_argument(
        "--engine",
        choices=["local", "ray", "both"],
        default="local",
        help="rmq migrate's engine: local (threads), ray, or both on fresh copies of the gallery",
    )
    parser.add_argument("--encoders", type=int, default=2, help="--engine ray: encoder actors")
    parser.add_argument("--decoders", type=int, default=2, help="--engine ray: decode tasks at once")
    parser.add_argument(
        "--out", type=Path, default=None, help="--engine ray|both: the report's file (default: results/)"
    )
    args = parser.parse_args()
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    if args.engine != "local":
        ray_main(args, items, layouts)
        return
    figures: dict[str, dict[str, list[dict]]] = {}
    stages: dict[str, dict[str, float]] = {}
    stage_loads: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rmq-migbench-") as tmp:
        folder = Path(tmp)
        store = indexed_gallery(folder, items, args.batch)
        heads = NEW_HEADS
        for key in args.models:
            model = convnet_encoder(folder / f"{key}.onnx", heads=heads, stages=MODELS[key][1], seed=2)
            decoder = OnnxEncoder(model)
            pixels = np.stack([decoder.decode(item.uri) for item in items])
            figures[key] = {layout: [] for layout in layouts}
            for repeat in range(args.repeats):
                turn = layouts[repeat % len(layouts) :] + layouts[: repeat % len(layouts)]  # who goes first
                for layout in turn:
                    name = f"{key}-{repeat}" + ("-one" if layout == SINGLE else "")
                    figures[key][layout].append(one_run(store, model, name, pixels, args, layout))
                    shown = {k: round(v, 1) for k, v in figures[key][layout][-1].items()}
                    print(f"  {key} {layout} run {repeat + 1}: {shown}", flush=True)
            if key == "ceiling":
                for layout in layouts:
                    stages[layout] = stage_costs(store, model, f"stages-{layout}", args, layout)
                    stage_loads[layout] = load()
        store.close()
    report(args, figures, stages, stage_loads)


def report(
    args: argparse.Namespace, figures: dict[str, dict[str, list[dict]]], stages: dict, loads: dict
) -> None:
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {machine()}; date: {date.today()}",
        f"images: {args.n:,} CIFAR-10 train JPEGs (32x32), batch {args.batch}, "
        f"fetch workers {args.fetch_workers or 'chosen by the migration (local files: 1 or 2, by pace)'}, "
        "embedded store; "
        f"median of {args.repeats} runs; "
        "with both layouts, each repeat runs both (who goes first alternates); `vs paired`: the "
        "median of single-collection / paired migration throughput over the repeats; ratio: migration / "
        "encoder alone with the migration's session options; `vs best`: migration / the faster of the "
        "two encoder figures; CPU a point: the process's CPU time (all threads) over the run, a "
        "point, which a loaded machine inflates far less than the rates; load: the 1-minute load "
        "average while each was measured (2 cores: "
        "above 2, other work shared them)",
        "",
        "| encoder (random weights, ONNX Runtime, CPU) | layout | encoder alone, migration's options "
        "| encoder alone, spinning threads | load | migration | with index builds | CPU a point | load "
        "| ratio | vs best | vs paired |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    summary: dict = {}
    for key, by_layout in figures.items():
        summary[key] = {}
        for layout, runs in by_layout.items():
            row = {f: statistics.median(r[f] for r in runs) for f in runs[0]}
            row["ratio"] = statistics.median(r["migration"] / r["encoder"] for r in runs)
            row["vs_best"] = statistics.median(
                r["migration"] / max(r["encoder"], r["encoder_spin"]) for r in runs
            )
            summary[key][layout] = {**row, "runs": runs}
            vs = ""
            if layout == SINGLE and PAIRED in by_layout:
                pairs = zip(runs, by_layout[PAIRED], strict=True)
                summary[key][layout]["vs_paired"] = statistics.median(
                    s["migration"] / p["migration"] for s, p in pairs
                )
                vs = f"{summary[key][layout]['vs_paired']:.2f}x"
            ratio, best = (
                ("—", "—") if key == "ceiling" else (f"**{row['ratio']:.2f}**", f"{row['vs_best']:.2f}")
            )
            lines.append(
                f"| {MODELS[key][0]} | {layout} | {row['encoder']:,.0f} points/s "
                f"| {row['encoder_spin']:,.0f} points/s | {row['load_encoder']:.1f} "
                f"| {row['migration']:,.0f} points/s | {row['with_builds']:,.0f} points/s "
                f"| {row['cpu_us']:.0f} µs | {row['load_migration']:.1f} | {ratio} | {best} | {vs} |"
            )
    if stages:
        summary["stages_us_per_point"] = stages
        summary["stages_load"] = loads
        lines += [
            "",
            "Where a point's time goes with the ceiling encoder, the stages one after another "
            "(one thread each, microseconds a point):",
            "",
            f"| stage | {' | '.join(stages)} |",
            "|---|" + "--:|" * len(stages),
            *(f"| {stage} | {' | '.join(f'{s[stage]:.0f}' for s in stages.values())} |" for stage in STAGES),
            f"| all (serial) | {' | '.join(f'{sum(s.values()):.0f}' for s in stages.values())} |",
            f"| load (1-minute average) | {' | '.join(f'{loads[layout]:.1f}' for layout in stages)} |",
        ]
    text = "\n".join(lines)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "migration_throughput.md").write_text(text + "\n")
    (RESULTS / "migration_throughput.json").write_text(json.dumps(summary, indent=1) + "\n")


# -- --engine ray|both ------------------------------------------------------------------------

#: What the Ray workers did (decode tasks, encoder calls, session loads), a line each, wall clock.
#: The benchmark runs as __main__, which Ray pickles by value: the workers append to this file.
SPANS = Path(tempfile.gettempdir()) / f"rmq-migbench-spans-{os.getpid()}.log"
_DECODE_CHUNK = ray_engine.decode_chunk


def _record(kind: str, start: float, rows: int) -> None:
    """On a Ray worker: one line of what it did, appended."""
    with open(SPANS, "a") as fh:
        fh.write(f"{kind} {os.getpid()} {start:.6f} {time.time():.6f} {rows}\n")


def timed_decode_chunk(info, config, rule, points, fetch_workers):  # noqa: ANN001, ANN201
    """ray_engine.decode_chunk, its time recorded."""
    start = time.time()
    loaded = _DECODE_CHUNK(info, config, rule, points, fetch_workers)
    _record("decode", start, len(points))
    return loaded


class TimedEncoderActor(ray_engine.EncoderActor):
    """ray_engine.EncoderActor, the time of its session load and of each call recorded."""

    def _load(self, graph):  # noqa: ANN001, ANN202
        start = time.time()
        encoder = super()._load(graph)
        _record("load", start, 0)
        return encoder

    def encode(self, graph, output, distance, ids, loaded):  # noqa: ANN001, ANN201
        start = time.time()
        result = super().encode(graph, output, distance, ids, loaded)
        _record("encode", start, len(ids))
        return result


class Timers:
    """Seconds the driver's threads spend in each wrapped method (overlapping: they are threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.finished: list[float] = []  # when each batch was encoded (perf_counter)

    def reset(self) -> None:
        with self.lock:
            self.seconds, self.finished = {}, []

    @contextlib.contextmanager
    def span(self, name: str):  # noqa: ANN201
        start = time.perf_counter()
        try:
            yield
        finally:
            with self.lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


TIMERS = Timers()
WORKERS_IMPORT: set[str] = set()  # where the Ray workers imported rm_qdrant from


def timed(name: str, method, *, finishes: bool = False):  # noqa: ANN001, ANN201
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with TIMERS.span(name):
            result = method(*args, **kwargs)
        if finishes:
            with TIMERS.lock:
                TIMERS.finished.append(time.perf_counter())
        return result

    return wrapper


class TimedRay:
    """The engine's ``ray`` module, its blocking calls (``wait``, ``get``) timed under the name
    of the engine's method that made them: ``dispatch`` waits for a decode slot, ``gather`` (and
    its ``_get``) for the encoders."""

    def __init__(self, ray) -> None:  # noqa: ANN001
        self._ray = ray

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._ray, name)

    def _timed(self, name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        caller = sys._getframe(2).f_code.co_name
        with TIMERS.span(f"{'gather' if caller == '_get' else caller}: ray.{name}"):
            return getattr(self._ray, name)(*args, **kwargs)

    def wait(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self._timed("wait", *args, **kwargs)

    def get(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self._timed("get", *args, **kwargs)


def _module_file() -> str:
    """On a Ray worker: where it imports rm_qdrant from."""
    return ray_engine.__file__


def instrument() -> None:
    """Wrap the engines' stages with timers (in this process only; rm_qdrant is not edited).
    RayMigrator inherits Migrator._claim and Migrator._settle; the local engine's _prepare
    includes its _claim."""
    Migrator._claim = timed("claim", Migrator._claim)
    Migrator._prepare = timed("prepare (claim, fetch, decode)", Migrator._prepare)
    Migrator._encode = timed("encode", Migrator._encode)
    Migrator._settle = timed("settle", Migrator._settle)
    Migrator._finish = timed("finish", Migrator._finish, finishes=True)  # local: the encode
    RayMigrator._finish = timed("finish", RayMigrator._finish, finishes=True)  # ray: the gather
    RayEngine.dispatch = timed("dispatch", RayEngine.dispatch)
    RayEngine.gather = timed("gather", RayEngine.gather)
    init = RayEngine.__init__

    def engine_init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        init(self, *args, **kwargs)
        self.ray = TimedRay(self.ray)

    RayEngine.__init__ = engine_init
    ray_engine.decode_chunk = timed_decode_chunk
    ray_engine.EncoderActor = TimedEncoderActor


def ray_options(args: argparse.Namespace) -> RayOptions:
    return RayOptions(encoders=args.encoders, decoders=args.decoders)


def ray_init(args: argparse.Namespace) -> None:
    """A local Ray for the timed runs, which run_migration then reuses (and leaves up)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    ray.init(
        num_cpus=max(os.cpu_count() or 1, ray_options(args).slots),  # as run_migration's own
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


def ray_startup(store, index: DualIndex, args: argparse.Namespace) -> dict[str, float]:
    """Seconds from no Ray to a local Ray whose encoder actors have answered: the RayEngine that
    run_migration makes (ray.init inside, actors created), then a chunk of 32 images decoded by
    a task and encoded by each actor (worker processes start, sessions load on that first call);
    the same round trip again, warm; and close (actors killed, Ray shut down). With Ray up: the
    same without ray.init and shutdown, what each run_migration on it pays (and it warms the
    pool of worker processes up for the timed runs)."""
    import ray

    migrator = Migrator(index, MigrateOptions(batch=args.batch))
    ids, payloads, _ = read_all(store, index.pair.old_collection, Where(), False)
    points = list(zip(ids, payloads, strict=True))

    def round_trip(engine: RayEngine) -> None:
        refs = []
        for k, actor in enumerate(engine.actors):
            chunk = points[k * 32 : (k + 1) * 32]
            decoded = engine._decode.remote(*engine.args[:3], chunk, engine.args[3])
            ids = [i for i, _ in chunk]
            refs.append(actor.encode.remote(engine.graph, engine.output, engine.distance, ids, decoded))
        for failed, encoded in ray.get(refs):
            assert not failed and len(encoded.ids) == 32, (failed, encoded.failed)

    clock = [time.perf_counter()]
    engine = RayEngine(
        ray_options(args),
        migrator.encoder,
        output=migrator.output,
        distance=migrator.pair.distance,
        source=SourceConfig(),
        rule=migrator.pair.uri_rule,
        fetch_workers=None,
        halt=threading.Event(),
    )
    clock.append(time.perf_counter())
    round_trip(engine)
    clock.append(time.perf_counter())
    round_trip(engine)
    clock.append(time.perf_counter())
    WORKERS_IMPORT.add(ray.get(ray.remote(num_cpus=0)(_module_file).remote()))
    engine.close()
    clock.append(time.perf_counter())
    return {
        "init": clock[1] - clock[0],
        "first": clock[2] - clock[1],
        "startup": clock[2] - clock[0],
        "warm": clock[3] - clock[2],
        "close": clock[4] - clock[3],
        "load": load(),
    }


def worker_spans(begin: float, end: float) -> dict[str, float]:
    """What the Ray workers did between ``begin`` and ``end`` (wall clock), summed over them."""
    spent = {"decode": 0.0, "encode": 0.0, "load": 0.0}
    first = {"decode": math.inf, "encode": math.inf, "load": math.inf}
    pids: dict[str, set] = {"decode": set(), "encode": set(), "load": set()}
    for line in SPANS.read_text().splitlines() if SPANS.exists() else []:
        kind, pid, start, stop, _ = line.split()
        if float(start) >= begin and float(stop) <= end:
            spent[kind] += float(stop) - float(start)
            first[kind] = min(first[kind], float(start) - begin)
            pids[kind].add(pid)
    return {
        "workers: decode": spent["decode"],
        "workers: encode": spent["encode"] - spent["load"],  # an actor's first call loads its session
        "workers: session loads": spent["load"],
        "first decode began after": first["decode"],
        "first encode began after": first["encode"],
        "decode processes": len(pids["decode"]),
    }


def engine_run(store, model: Path, name: str, args: argparse.Namespace, layout: str, engine: str) -> dict:
    """The gallery migrated whole on a fresh pair by ``engine`` (local or ray), its stages timed."""
    index = copy_gallery(store, model, name, layout)
    options = MigrateOptions(batch=args.batch, fetch_workers=args.fetch_workers)
    TIMERS.reset()
    load_before, begin = load(), time.time()
    start = time.perf_counter()
    report = run_migration(index, options, ray=ray_options(args) if engine == "ray" else None)
    call = time.perf_counter() - start
    end = time.time()
    assert report.moved == args.n and report.failed == 0, report
    done = TIMERS.finished  # the batches' encodes ending; the first one's is the pipeline filling
    steady = (args.n - args.batch) / (done[-1] - done[0]) if len(done) > 1 else math.nan
    row = {
        "migration": report.moved / (report.seconds - report.optimize_seconds),
        "with_builds": report.moved / report.seconds,
        "call": report.moved / call,  # run_migration whole: plan, engine start and close, builds
        "steady": steady,  # batches after the first: first batch encoded to last batch encoded
        "first batch encoded after": done[0] - start,
        "seconds": report.seconds,
        "call_seconds": call,
        "optimize": report.optimize_seconds,
        "load_before": load_before,
        "load_after": load(),
        **dict(TIMERS.seconds),
    }
    if engine == "ray":
        row.update(worker_spans(begin, end))
    return row


def ray_main(args: argparse.Namespace, items: list, layouts: list[str]) -> None:
    """--engine ray|both: per encoder, Ray's start-up alone, one run that starts Ray (what the CLI
    does), then ``--repeats`` runs of each engine on a Ray started once, who goes first rotating."""
    import ray

    instrument()
    engines = ["local", "ray"] if args.engine == "both" else ["ray"]
    variants = [(layout, engine) for layout in layouts for engine in engines]
    figures: dict[str, dict[tuple[str, str], list[dict]]] = {}
    startup: dict[str, dict] = {}
    cold: dict[str, dict] = {}
    up: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rmq-migbench-") as tmp:
        folder = Path(tmp)
        store = indexed_gallery(folder, items, args.batch)
        heads = NEW_HEADS
        try:
            for key in args.models:
                model = convnet_encoder(folder / f"{key}.onnx", heads=heads, stages=MODELS[key][1], seed=2)
                if ray.is_initialized():
                    ray.shutdown()
                startup[key] = ray_startup(store, copy_gallery(store, model, f"{key}-up", layouts[0]), args)
                print(
                    f"  {key} ray start-up: { {k: round(v, 2) for k, v in startup[key].items()} }", flush=True
                )
                cold[key] = engine_run(store, model, f"{key}-cold", args, layouts[0], "ray")  # starts Ray
                print(f"  {key} ray run starting Ray: {shown(cold[key])}", flush=True)
                ray_init(args)
                up[key] = ray_startup(store, copy_gallery(store, model, f"{key}-warm", layouts[0]), args)
                print(f"  {key} with Ray up, actors' start: {shown(up[key])}", flush=True)
                figures[key] = {variant: [] for variant in variants}
                for repeat in range(args.repeats):
                    turn = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
                    for layout, engine in turn:
                        name = f"{key}-{repeat}-{engine}" + ("-one" if layout == SINGLE else "")
                        run = engine_run(store, model, name, args, layout, engine)
                        figures[key][layout, engine].append(run)
                        print(f"  {key} {layout} {engine} run {repeat + 1}: {shown(run)}", flush=True)
        finally:
            if ray.is_initialized():
                ray.shutdown()
            store.close()
            SPANS.unlink(missing_ok=True)
    ray_report(args, figures, startup, cold, up)


def shown(run: dict) -> dict:
    return {k: round(v, 2) for k, v in run.items()}


def ray_report(args: argparse.Namespace, figures: dict, startup: dict, cold: dict, up: dict) -> None:
    median = statistics.median
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {machine()}; date: {date.today()}; rm_qdrant: {ray_engine.__file__} "
        f"(Ray workers: {', '.join(sorted(WORKERS_IMPORT))})",
        f"images: {args.n:,} CIFAR-10 train JPEGs (32x32), batch {args.batch}, "
        f"fetch workers {args.fetch_workers or 'by source (2 for local files)'}, embedded store; "
        f"ray: {args.encoders} encoder actors (ONNX Runtime, 1 thread each), {args.decoders} decode "
        f"tasks at once, a local Ray started once before the timed runs (num_cpus "
        f"{max(os.cpu_count() or 1, ray_options(args).slots)}), which run_migration reuses; local: "
        "the engine's threads, its session on ONNX Runtime's default threads; "
        f"median of {args.repeats} runs, each on a fresh copy of the gallery, the engines "
        "taking turns to go first; `ray / local`: the median over the repeats of the two "
        "engines' ratio; migration: points / the run's own seconds less its index builds (the "
        "Ray engine's actors are created by each run: their processes' start and session load "
        "fall in it); load: the 1-minute load average before and after each run (2 cores, "
        "shared with other work, test runs included: above 2, something else had them)",
        "",
        "| encoder (random weights, ONNX Runtime, CPU) | layout | engine | migration | with index "
        "builds | run_migration call | after the first batch | load before | load after "
        "| ray / local | ray / local, after the first batch |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, by_variant in figures.items():
        for (layout, engine), runs in by_variant.items():
            ratio = steady = ""
            if engine == "ray" and (layout, "local") in by_variant:
                pairs = list(zip(runs, by_variant[layout, "local"], strict=True))
                ratio = f"**{median(r['migration'] / loc['migration'] for r, loc in pairs):.2f}**"
                steady = f"{median(r['steady'] / loc['steady'] for r, loc in pairs):.2f}"
            lines.append(
                f"| {MODELS[key][0]} | {layout} | {engine} | {median(r['migration'] for r in runs):,.0f} "
                f"points/s | {median(r['with_builds'] for r in runs):,.0f} points/s "
                f"| {median(r['call'] for r in runs):,.0f} points/s "
                f"| {median(r['steady'] for r in runs):,.0f} points/s "
                f"| {median(r['load_before'] for r in runs):.1f} "
                f"| {median(r['load_after'] for r in runs):.1f} "
                f"| {ratio} | {steady} |"
            )
    lines += [
        "",
        "Ray's start-up, apart (seconds): `ray.init + actors`: the RayEngine run_migration makes, "
        "from no Ray (ray.init, the graph put, the actors created); `first round trip`: a chunk of "
        "32 images decoded by a task and encoded by each actor (worker processes start, each "
        "actor loads its session); `start-up`: the two, Ray up with its encoders ready; `warm "
        "round trip`: the same again; `close`: actors killed and Ray shut down. `one run starting "
        "Ray`: run_migration from no Ray, start-up and shutdown included (what `rmq migrate "
        "--engine ray` costs a user), its wall seconds and points/s. `with Ray up`: the same "
        "RayEngine and first round trip on the Ray started for the timed runs (the actors' "
        "processes start and load their sessions: what each run_migration pays on a Ray already "
        "up), its load:",
        "",
        "| encoder | ray.init + actors | first round trip | **start-up** | warm round trip | close "
        "| load | one run starting Ray | its points/s | its load after | with Ray up: actors + first "
        "round trip | load |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, cold_up in startup.items():
        run, warm = cold[key], up[key]
        lines.append(
            f"| {MODELS[key][0]} | {cold_up['init']:.2f} | {cold_up['first']:.2f} "
            f"| **{cold_up['startup']:.2f}** | {cold_up['warm']:.3f} | {cold_up['close']:.2f} "
            f"| {cold_up['load']:.1f} | {run['call_seconds']:.1f} s | {run['call']:,.0f} "
            f"| {run['load_after']:.1f} | {warm['startup']:.2f} | {warm['load']:.1f} |"
        )
    stages = [
        "seconds",
        "claim",
        "dispatch",
        "dispatch: ray.wait",
        "gather",
        "gather: ray.wait",
        "gather: ray.get",
        "settle",
        "workers: decode",
        "workers: encode",
        "workers: session loads",
        "first batch encoded after",
        "first decode began after",
        "first encode began after",
        "decode processes",
        "prepare (claim, fetch, decode)",
        "encode",
    ]
    lines += [
        "",
        "Where the time goes (median seconds a run): the driver's stages (threads: they overlap) "
        "and, for ray, the workers' busy seconds summed over them. `seconds`: the run's own. "
        "ray: `claim` (prepare thread: read and, one collection, token the batch), `dispatch` "
        "(prepare thread: send its chunks out; blocks in `ray.wait` while "
        f"{args.decoders} decode tasks run), `gather` (the run's thread: waits in `ray.get`, or "
        "`ray.wait`, for the encoders), `settle` (writer thread: the store's writes and "
        f"read-backs); `workers: decode` (decode tasks' seconds, up to {args.decoders} at once), "
        f"`workers: encode` (the actors' calls less their session loads, up to {args.encoders} at "
        "once); `first batch encoded after`: from the run_migration call; `first decode (encode) "
        "began after`: from the call, when a worker began the run's first decode task (encoder "
        "call); `decode processes`: the worker processes that ran decode tasks. local: `prepare` "
        "(claim, fetch, decode), `encode`, `settle`.",
        "",
    ]
    columns = [(key, variant) for key, by_variant in figures.items() for variant in by_variant]
    head = [f"{key} {layout} {engine}" for key, (layout, engine) in columns]
    lines += [f"| stage | {' | '.join(head)} |", "|---|" + "--:|" * len(columns)]
    for stage in stages:
        cells = []
        for key, variant in columns:
            runs = figures[key][variant]
            cells.append(f"{median(r[stage] for r in runs):.2f}" if stage in runs[0] else "")
        if any(cells):
            lines.append(f"| {stage} | {' | '.join(cells)} |")
    lines += ["", "Each run (points/s, seconds, loads):", "", "```"]
    for key, by_variant in figures.items():
        lines.append(f"{key} one run starting Ray: {shown(cold[key])}")
        for (layout, engine), runs in by_variant.items():
            lines += [f"{key} {layout} {engine} run {i + 1}: {shown(r)}" for i, r in enumerate(runs)]
    lines.append("```")
    text = "\n".join(lines)
    print("\n" + text)
    out = args.out or RESULTS / "migration_throughput-ray.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
