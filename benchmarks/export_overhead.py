"""Cost of the two-output graph over φ_new alone, and ONNX Runtime against PyTorch eager.

For a backbone with random weights (small-cnn or resnet18, CIFAR size) and ρ/ψ heads
(2 blocks each), exports φ_new+ρ+ψ (outputs new, rev) and φ_new alone (output
embedding), both through the same exporter, and times them side by side in one
run with the same session options: the runs alternate, so machine noise hits both.
Then times the two-output graph in ONNX Runtime against the same module in
PyTorch eager (no_grad, eval).

Run: ``python benchmarks/export_overhead.py [--arch small-cnn] [--repeats 200]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from rm_qdrant_exporters.serving import ServingGraph, export_backbone, export_serving
from rm_qdrant_train.backbone import load_backbone, save_backbone
from rm_qdrant_train.backbones import build_backbone
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.heads import Heads, load_heads, save_heads


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="small-cnn")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.manual_seed(0)
        model = build_backbone(args.arch, num_classes=10, embed_dim=128)
        new = save_backbone(
            model,
            BackboneConfig(out=str(folder / "new.pt"), arch=args.arch),
            list("abcdefghij"),
            epoch=0,
            metric={},
        )
        heads = save_heads(
            Heads(128, 128).eval(),
            HeadsConfig(old=str(new), new=str(new), out=str(folder / "h.pt")),
            epoch=0,
            loss=0.0,
        )
        two, _ = export_serving(new, heads, folder / "two.onnx")
        one, _ = export_backbone(new, folder / "one.onnx", role="new", scores=False)
        options = ort.SessionOptions()
        sessions = {
            k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
            for k, p in (("two", two), ("one", one))
        }
        backbone, meta = load_backbone(new)
        eager = ServingGraph(backbone, meta["mean"], meta["std"], load_heads(heads)[0]).eval()
        rows = []
        for batch in (1, 64):
            images = np.random.default_rng(0).integers(0, 256, size=(batch, 32, 32, 3), dtype=np.uint8)
            feed = {"images": images}
            results = {"two": [], "one": []}
            for _ in range(5):  # alternate blocks of runs so drift hits both graphs
                for key in ("two", "one"):
                    run = sessions[key].run
                    results[key].append(
                        median_ms(lambda run=run, feed=feed: run(None, feed), args.repeats // 5)
                    )
            two_ms, one_ms = float(np.median(results["two"])), float(np.median(results["one"]))
            with torch.no_grad():
                x = torch.from_numpy(images)
                eager_ms = median_ms(lambda x=x: eager(x), max(10, args.repeats // 5))
            onnx_ms = median_ms(lambda f=feed: sessions["two"].run(None, f), max(10, args.repeats // 5))
            rows.append(
                (batch, one_ms, two_ms, two_ms / one_ms, batch / eager_ms * 1000, batch / onnx_ms * 1000)
            )
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"{args.arch} (random weights), 32x32 uint8 input, heads 128→128→128, ONNX Runtime CPU, "
        f"torch {torch.get_num_threads()} threads\n"
    )
    print("| batch | φ_new alone (ms) | φ_new+ρ+ψ (ms) | **overhead** | PyTorch eager (img/s) ", end="")
    print("| ONNX Runtime (img/s) |")
    print("|--:|--:|--:|--:|--:|--:|")
    for batch, one_ms, two_ms, ratio, eager_rate, onnx_rate in rows:
        print(f"| {batch} | {one_ms:.3f} | {two_ms:.3f} | **{ratio:.3f}** | {eager_rate:,.0f} ", end="")
        print(f"| {onnx_rate:,.0f} |")


if __name__ == "__main__":
    main()
