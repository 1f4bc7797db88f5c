"""How close ``decode="fast"`` comes to ``exact``, measured through a trained network.

A random-init network is no judge of fidelity (its features of two different photos are
about as far apart as those of one photo decoded two ways), and no ImageNet embedding
model can be downloaded here. What ships inside a PyPI package is NudeNet's detector
(``nudenet``, MIT; ``nudenet/320n.onnx``, a YOLOv8n trained on real photos of people).
Its backbone, cut after the SPPF block and mean-pooled, is a 256-d image embedding of a
network trained on photos: the stand-in for a team's new model here. For each gallery
photo the embedding of its fast-decoded pixels is compared with that of its exact
ones (cosine), next to the cosine of two different photos for scale.

Run: ``pip install nudenet`` (a benchmark-only dependency), then
``python benchmarks/photo_fidelity.py [--gallery DIR] [--size 224]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import photo_gallery  # noqa: E402
from rm_qdrant import OnnxEncoder  # noqa: E402
from rm_qdrant.caches import cache_root  # noqa: E402
from rm_qdrant.models.stamp import stamp_model  # noqa: E402

CUT = "/model.9/cv2/act/Mul_output_0"  # the SPPF block's output: the end of YOLOv8's backbone


def embedding_graph(size: int) -> Path:
    """NudeNet's backbone + a global mean pool, stamped: x/255, RGB, shorter side size * 8/7, crop size."""
    try:
        import nudenet
    except ImportError:
        sys.exit("photo_fidelity needs NudeNet's trained graph: pip install nudenet")
    source = Path(nudenet.__file__).parent / "320n.onnx"
    out = cache_root() / "photo-fidelity" / f"nudenet-backbone-{size}.onnx"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cut = out.with_suffix(".cut.onnx")
    onnx.utils.extract_model(str(source), str(cut), ["images"], [CUT])
    model = onnx.load(str(cut))
    model.graph.output.pop()
    model.graph.node.extend(
        [
            helper.make_node("GlobalAveragePool", [CUT], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["embedding"], axis=1),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("embedding", onnx.TensorProto.FLOAT, ["N", 256]))
    onnx.save(model, str(cut))
    resize = round(size * 8 / 7)
    stamp_model(
        cut,
        out,
        outputs={"embedding": "embedding"},
        size=size,
        layout="NCHW",
        dtype="float32",
        resize=resize,
        crop=size,
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        name="nudenet-backbone",
    )
    cut.unlink()
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gallery", type=Path, help="a gallery folder (default: build it in the cache)")
    parser.add_argument("--size", type=int, default=224, help="the graph's input side (default 224)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    folder, photos = photo_gallery.build(args.gallery)
    graph = embedding_graph(args.size)
    started = time.perf_counter()
    exact, fast = (OnnxEncoder(graph, decode=mode, threads=1) for mode in ("exact", "fast"))
    files = [str(folder / p["file"]) for p in photos]
    vectors = {mode: enc.encode(files)["embedding"] for mode, enc in (("exact", exact), ("fast", fast))}
    same = cosine(vectors["exact"], vectors["fast"])
    other = cosine(vectors["exact"], np.roll(vectors["exact"], 1, axis=0))
    print(f"# photo_fidelity: `python benchmarks/photo_fidelity.py --size {args.size}`\n")
    print(
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(
        f"- Graph: NudeNet 320n backbone (trained YOLOv8n), {args.size}x{args.size} input, resize "
        f"{round(args.size * 8 / 7)} + centre crop; gallery {folder} ({len(photos)} photos)\n"
    )
    print("| class | photos | cosine fast vs exact: min | median | two different photos (exact): median |")
    print("|---|--:|--:|--:|--:|")
    classes = sorted({p["size_class"] for p in photos}, key=lambda c: int(c.split("x")[0]))
    rows = {}
    for name in [*classes, "all"]:
        pick = np.array([name in ("all", p["size_class"]) for p in photos])
        rows[name] = (
            int(pick.sum()),
            float(same[pick].min()),
            float(np.median(same[pick])),
            float(np.median(other[pick])),
        )
        print(
            f"| {name} | {rows[name][0]} | {rows[name][1]:.4f} | {rows[name][2]:.4f} | {rows[name][3]:.3f} |"
        )
    worst = photos[int(np.argmin(same))]
    print(
        f"\nLowest: {worst['file']} ({worst['format']} {worst['mode']}), cosine {same.min():.4f}. "
        f"Goal (issue 42): median >= 0.995: {'met' if rows['all'][2] >= 0.995 else 'missed'}."
    )
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
