"""PyTorch's thread count on a shared CPU: a ψ/ρ head step and a small-CNN batch at 1, 2 and the default.

Each figure comes from a fresh child process (PyTorch fixes some thread pools at start-up)
that applies ``--threads`` as ``rmq train``/``fit``/``demo`` do
(:func:`rm_qdrant_train.threads.use_threads`; "default" means no ``--threads`` and no
``OMP_NUM_THREADS``), then times, after two warm-up steps, the median of up to
``--steps`` steps (or as many as fit in ``--seconds``):

- head step: ρ and ψ (2 blocks, hidden 512) on 128-d embeddings, MCL loss with hard
  mining on a batch of 256, one Adam step (what ``rmq train heads`` and ``rmq fit`` repeat);
- backbone batch: small-cnn forward and backward on 64 CIFAR-size images, one SGD step.

It runs every count twice: on the machine as it is, then with ``--load`` busy loops
(``python -c "while True: pass"``) beside it, which it starts and stops itself. ``uptime``'s
load average is printed beside every figure.

Run: ``python benchmarks/threads.py [--load 2] [--steps 20] [--seconds 8] [--out FILE.md]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = "--child"


def child(threads: str, steps: int, seconds: float) -> dict[str, float | int | str]:
    import torch

    from rm_qdrant_train.backbones import build_backbone
    from rm_qdrant_train.heads import Heads
    from rm_qdrant_train.losses import contrastive_loss
    from rm_qdrant_train.threads import use_threads

    choice = use_threads(None if threads == "default" else int(threads))
    torch.manual_seed(0)
    heads = Heads(128, 128)
    x, old, labels = torch.randn(256, 128), torch.randn(256, 128), torch.randint(0, 10, (256,))
    adam = torch.optim.Adam(heads.parameters(), lr=1e-3)

    def head_step() -> None:
        new, rev = heads(x)
        loss = contrastive_loss("mcl", rev, old, new, labels)
        adam.zero_grad()
        loss.backward()
        adam.step()

    cnn = build_backbone("small-cnn", num_classes=10, embed_dim=128)
    images, targets = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    sgd = torch.optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9)

    def cnn_step() -> None:
        _, logits = cnn(images)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        sgd.zero_grad()
        loss.backward()
        sgd.step()

    return {
        "threads": choice.threads,
        "reason": choice.reason,
        "head_ms": _median_ms(head_step, steps, seconds),
        "cnn_ms": _median_ms(cnn_step, steps, seconds),
    }


def _median_ms(step, steps: int, seconds: float) -> float:
    for _ in range(2):
        step()
    times: list[float] = []
    budget = time.perf_counter() + seconds
    while len(times) < steps and (len(times) < 3 or time.perf_counter() < budget):
        started = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - started))
    times.sort()
    return round(times[len(times) // 2], 1)


def load_average() -> str:
    return (
        subprocess.run(["uptime"], capture_output=True, text=True).stdout.split("load average:")[-1].strip()
    )


def measure(threads: str, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    before = load_average()
    cmd = [sys.executable, __file__, CHILD, threads, str(args.steps), str(args.seconds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the child for --threads {threads} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "asked": threads, "load": before}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--load", type=int, default=2, help="busy loops for the loaded runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args()
    lines = [
        f"cores: {len(os.sched_getaffinity(0))}; median ms per step, after 2 warm-up steps",
        "",
        "| machine | --threads | threads used (why) | head step ms | small-cnn batch ms "
        "| uptime load (1, 5, 15 min) |",
        "|---|---|---|---:|---:|---|",
    ]
    print("\n".join(lines), flush=True)
    for loaded in (False, True):
        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load if loaded else 0)
        ]
        try:
            if spinners:
                time.sleep(5)  # let the load average see them
            for threads in ("1", "2", "default"):
                r = measure(threads, args)
                row = (
                    f"| {'+' + str(args.load) + ' busy loops' if loaded else 'as it is'} | {r['asked']} | "
                    f"{r['threads']} ({r['reason']}) | {r['head_ms']} | {r['cnn_ms']} | {r['load']} |"
                )
                lines.append(row)
                print(row, flush=True)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
    else:
        main()
