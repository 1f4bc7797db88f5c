"""What serving metrics costs a migration (``rmq migrate --metrics-port``) and a search
(``DualIndex(metrics=SearchMetrics(registry))``), in one run.

Indexes CIFAR-10 JPEGs (real 32x32 files from ../shared/data) into an old collection of the
embedded store, then migrates fresh copies of that gallery with ``rm_qdrant.migrate``, the
same options each time, with and without ``metrics_port``, side by side: each repeat runs
both, who goes first alternating. The encoder is the pipeline's ceiling (pooling and a matrix
product: benchmarks/convnet.py's ``NULL``), so that the figure is about rm-qdrant's own cost,
not the model's. While a run with metrics goes on, a thread scrapes it over HTTP every
``--scrape-every`` seconds (Prometheus scrapes every 15 to 60 s; once a second is harsher),
and each scrape reads the pair's figures from the store at most every ``--refresh`` seconds
(the migration's default, 15 s; 0: at every scrape, the worst case).

Throughput is points moved over the run's seconds less its index builds (what
migration_throughput.py calls ``migration``); the ratio is the median over the repeats of
(with metrics / without). ``CPU a point`` is the process's CPU time (every thread: the
scraper's requests too) over the whole call, index builds included, a point: a machine shared
with other work inflates it far less than the rates. Then ``--queries`` searches of a
half-migrated pair, through two DualIndexes of it (one with SearchMetrics, one without),
alternating, give both p50 latencies. Last, what each part of the metrics costs alone (see
``direct_costs``), and the share of a run's CPU that implies.

Run: ``python benchmarks/metrics_overhead.py [--n 10000] [--batch 1000] [--repeats 5]
[--scrape-every 1] [--refresh 15] [--queries 2000]``
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import httpx
import numpy as np
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.convnet import NULL, convnet_encoder  # noqa: E402
from benchmarks.migration_throughput import NEW_HEADS, copy_gallery, indexed_gallery  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, SearchMetrics, migrate, scan_image_folder  # noqa: E402
from rm_qdrant.monitoring import MetricsServer, MigrationMetrics, migration, read_figures  # noqa: E402
from rm_qdrant.pair.outcome import STAGES, BatchResult  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Scraper:
    """Scrapes ``port`` every ``every`` seconds on a thread until stopped; counts the scrapes."""

    def __init__(self, port: int, every: float) -> None:
        self.url, self.every = f"http://127.0.0.1:{port}/metrics", every
        self.scrapes, self.failures = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.wait(self.every):
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False  # the run ended between two scrapes
                self.scrapes += ok
                self.failures += not ok

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_run(store, model: Path, name: str, args: argparse.Namespace, metrics: bool) -> dict:
    """A fresh copy of the gallery migrated whole, with or without its metrics served."""
    copy_gallery(store, model, name)  # its order prepared, untimed
    options = {"batch": args.batch, "fetch_workers": args.fetch_workers}
    cpu = time.process_time()
    if not metrics:
        report = migrate(store, name, **options)
        scrapes = 0
    else:
        port = free_port()
        scraper = Scraper(port, args.scrape_every)
        # the server binds when migrate starts: the scraper's first tries may find nothing yet
        with scraper:
            report = migrate(store, name, metrics_port=port, **options)
        scrapes = scraper.scrapes
    cpu = time.process_time() - cpu
    assert report.moved == args.n and report.failed == 0, report
    return {
        "rate": report.moved / (report.seconds - report.optimize_seconds),
        "cpu_us": cpu / report.moved * 1e6,
        "scrapes": scrapes,
        "load": os.getloadavg()[0],
    }


def search_latency(store, model: Path, args: argparse.Namespace) -> dict[str, float]:
    """p50 seconds of a search of a half-migrated pair, with and without SearchMetrics."""
    copy_gallery(store, model, "search")
    migrate(store, "search", batch=args.batch, until=0.5)
    plain = DualIndex.open(store, "search")
    observed = DualIndex.open(store, "search", metrics=SearchMetrics(CollectorRegistry()))
    rng = np.random.default_rng(0)
    new_q = rng.normal(size=(args.queries, 128)).astype(np.float32)
    old_q = rng.normal(size=(args.queries, 64)).astype(np.float32)
    spent: dict[str, list[float]] = {"without": [], "with": []}
    for i in range(args.queries):
        turn = [("without", plain), ("with", observed)]
        for key, index in turn if i % 2 else turn[::-1]:
            start = time.perf_counter()
            index.search_vectors(new_q[i], old_q[i], limit=10)
            spent[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in spent.items()}


def direct_costs(store, model: Path, args: argparse.Namespace) -> dict[str, float]:
    """CPU microseconds of each thing serving metrics adds, measured alone (a loaded machine
    blurs a few per cent of a whole run's rate; these it hardly moves): a scrape over HTTP
    (client and server, both in this process) with the pair's figures cached, and with them read
    from the store at each scrape; observing a settled batch; the stage timing that every batch
    does, metrics or not (three clock reads an image)."""
    copy_gallery(store, model, "costs")
    migrate(store, "costs", batch=args.batch, until=0.5)
    costs = {}
    for key, every in (("scrape", 3600.0), ("scrape_reading", 0.0)):
        with MetricsServer(free_port(), host="127.0.0.1") as server, httpx.Client() as client:
            MigrationMetrics(server.registry, "costs", read=lambda: read_figures(store, "costs"), every=every)
            client.get(server.url)  # the first read of the figures
            cpu = time.process_time()
            for _ in range(200):
                client.get(server.url)
            costs[key] = (time.process_time() - cpu) / 200 * 1e6
    metrics = MigrationMetrics(CollectorRegistry(), "costs")
    result = BatchResult(args.batch, 0, [], 0, 0, stages=dict.fromkeys(STAGES, 0.1))
    cpu = time.process_time()
    for _ in range(10_000):
        metrics.observe(result)
    costs["observe"] = (time.process_time() - cpu) / 10_000 * 1e6
    cpu = time.process_time()
    for _ in range(100_000):
        time.perf_counter(), time.perf_counter(), time.perf_counter()
    costs["timing_per_image"] = (time.process_time() - cpu) / 100_000 * 1e6
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="images to migrate (CIFAR-10 train)")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--fetch-workers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--refresh", type=float, default=migration.REFRESH_SECONDS, help="see above")
    parser.add_argument("--queries", type=int, default=2_000)
    args = parser.parse_args()
    migration.REFRESH_SECONDS = args.refresh
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory(prefix="rmq-metricsbench-") as tmp:
        folder = Path(tmp)
        store = indexed_gallery(folder, items, args.batch)
        model = convnet_encoder(folder / "ceiling.onnx", heads=NEW_HEADS, stages=NULL, seed=2)
        for repeat in range(args.repeats):
            order = ("without", "with") if repeat % 2 == 0 else ("with", "without")
            for key in order:
                runs[key].append(one_run(store, model, f"r{repeat}-{key}", args, key == "with"))
                shown = {k: round(v, 1) for k, v in runs[key][-1].items()}
                print(f"  run {repeat + 1}, {key} metrics: {shown}", flush=True)
        latency = search_latency(store, model, args)
        costs = direct_costs(store, model, args)
        store.close()
    report(args, runs, latency, costs)


def implied(
    costs: dict[str, float], rate: float, cpu_us: float, args: argparse.Namespace, every: float
) -> float:
    """The share of a run's CPU that metrics scraped every ``every`` seconds take, from the
    direct costs, at ``rate`` points/s and ``cpu_us`` CPU a point without metrics."""
    reads = 1 / max(every, args.refresh)  # figures read a second
    per_second = costs["scrape"] / every + (costs["scrape_reading"] - costs["scrape"]) * reads
    per_point = per_second / rate + costs["observe"] / args.batch
    return per_point / cpu_us


def report(
    args: argparse.Namespace, runs: dict[str, list[dict]], latency: dict[str, float], costs: dict[str, float]
) -> None:
    pairs = list(zip(runs["with"], runs["without"], strict=True))
    ratios = [w["rate"] / o["rate"] for w, o in pairs]
    rate = statistics.median(r["rate"] for r in runs["without"])
    cpu_us = statistics.median(r["cpu_us"] for r in runs["without"])
    cpu_ratios = [w["cpu_us"] / o["cpu_us"] for w, o in pairs]
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {machine()}; date: {date.today()}",
        f"images: {args.n:,} CIFAR-10 train JPEGs (32x32), batch {args.batch}, the ceiling encoder, "
        f"embedded store; {args.repeats} repeats, each running both (who goes first alternates); "
        f"with metrics: scraped every {args.scrape_every:g} s, the pair's figures read at most every "
        f"{args.refresh:g} s",
        "",
        "| metrics | points/s (median) | each run | CPU a point (median) | scrapes a run | load (1-min) |",
        "|---|--:|---|--:|--:|--:|",
    ]
    for key, rows in runs.items():
        rates = ", ".join(f"{r['rate']:,.0f}" for r in rows)
        lines.append(
            f"| {key} | {statistics.median(r['rate'] for r in rows):,.0f} | {rates} "
            f"| {statistics.median(r['cpu_us'] for r in rows):.0f} µs "
            f"| {statistics.median(r['scrapes'] for r in rows):.0f} "
            f"| {statistics.median(r['load'] for r in rows):.1f} |"
        )
    lines += [
        "",
        f"with / without, median of the repeats' ratios: **{statistics.median(ratios):.3f}** "
        f"(each: {', '.join(f'{r:.3f}' for r in ratios)}); CPU a point, with / without: "
        f"**{statistics.median(cpu_ratios):.3f}** (each: {', '.join(f'{r:.3f}' for r in cpu_ratios)})",
        "",
        "What each part costs alone (CPU µs, this process): a scrape with the pair's figures cached "
        f"{costs['scrape']:.0f}, a scrape that reads them from the store {costs['scrape_reading']:.0f}, "
        f"observing a batch {costs['observe']:.1f}; the stage timing every batch does, metrics or not, "
        f"{costs['timing_per_image']:.2f} an image. At the runs' pace without metrics, that is "
        + ", ".join(
            f"**{implied(costs, rate, cpu_us, args, every):.2%}** of a run's CPU scraped every {every:g} s"
            for every in (args.scrape_every, 15.0)
        )
        + f" (and {costs['timing_per_image'] / cpu_us:.2%} for the stage timing)",
        "",
        f"search of a half-migrated pair, p50 of {args.queries} each (alternating): without metrics "
        f"{latency['without'] * 1e6:.0f} µs, with SearchMetrics {latency['with'] * 1e6:.0f} µs "
        f"({latency['with'] / latency['without']:.3f}x)",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metrics_overhead.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
