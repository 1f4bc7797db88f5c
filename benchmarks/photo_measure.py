"""The measurements of benchmarks/photo_throughput.py that need no store: preprocessing per image
(before issue 42, exact, fast), decode-only ceilings, the exact path's stages, and fidelity."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image

from benchmarks import photo_before
from rm_qdrant import OnnxEncoder, open_store
from rm_qdrant.models.images import pixels
from rm_qdrant.sources.files import read_file

SIZE = {"resize": 256, "crop": 224, "height": 224, "width": 224, "channels": 3}
MAX_BYTES = 20 * 1024 * 1024
VARIANTS = ("before", "exact", "fast")


def run_variant(variant: str, path: Path) -> np.ndarray:
    """One photo's 224 x 224 pixels by the pre-issue-42 copy, or by ``pixels(decode=variant)``."""
    if variant == "before":
        return photo_before.pixels(path)
    return pixels(path, decode=variant, **SIZE)


def per_image(work: Callable[[object], object], items: list, repeats: int) -> tuple[float, float]:
    """Seconds an item of ``items`` takes under ``work``, (best, median) of ``repeats`` passes
    over them all, after one pass that is not timed (it warms caches and allocators up)."""
    for item in items:
        work(item)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            work(item)
        passes.append((time.perf_counter() - start) / len(items))
    return min(passes), statistics.median(passes)


def preprocessing(paths: list[Path], repeats: int) -> dict:
    """Seconds an image for each variant, after a pass of each that is not timed: ``class``, the
    (best, median) of the passes over all of ``paths``; ``photo``, each photo's median. The
    variants interleave, repeat by repeat, so drift on a shared machine hits all three alike."""
    for variant in VARIANTS:
        for path in paths:
            run_variant(variant, path)
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    each: dict[str, list[list[float]]] = {v: [[] for _ in paths] for v in VARIANTS}
    for repeat in range(repeats):
        for variant in VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]:
            start = time.perf_counter()
            for i, path in enumerate(paths):
                begin = time.perf_counter()
                run_variant(variant, path)
                each[variant][i].append(time.perf_counter() - begin)
            runs[variant].append((time.perf_counter() - start) / len(paths))
    return {
        "class": {v: (min(runs[v]), statistics.median(runs[v])) for v in VARIANTS},
        "photo": {v: [statistics.median(t) for t in each[v]] for v in VARIANTS},
    }


def _jpeg_kind(data: bytes) -> str | None:
    try:
        return simplejpeg.decode_jpeg_header(data)[2] if data[:2] == b"\xff\xd8" else None
    except ValueError:  # CMYK: simplejpeg cannot say its subsampling
        return None


def _pillow(data: bytes) -> None:
    picture = Image.open(io.BytesIO(data))
    picture.load()


def decode_ceilings(entries: list[dict], folder: Path, repeats: int) -> dict[str, tuple[float, int]]:
    """Seconds an image (best of ``repeats``) and the count, of decoding alone from bytes in memory:
    simplejpeg at full size and at its DCT scale covering 256, Pillow for PNG, WebP and CMYK JPEG."""
    groups: dict[str, list[bytes]] = {}
    for entry in entries:
        data = (folder / entry["file"]).read_bytes()
        kind = _jpeg_kind(data)
        if kind in ("YCbCr", "Gray"):
            groups.setdefault("jpeg", []).append(data)
        else:
            groups.setdefault("pillow " + (entry["format"] if kind is None else "CMYK"), []).append(data)
    out = {}
    for name, blobs in groups.items():
        if name == "jpeg":
            full = per_image(lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB"), blobs, repeats)
            dct = per_image(
                lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB", min_width=256, min_height=256),
                blobs,
                repeats,
            )
            out["simplejpeg full"], out["simplejpeg DCT"] = (full[0], len(blobs)), (dct[0], len(blobs))
        else:
            out[name.replace("pillow JPEG", "pillow CMYK")] = (
                per_image(_pillow, blobs, repeats)[0],
                len(blobs),
            )
    return out


STAGES = ("read", "decode", "convert", "resize", "layout", "encode", "write")


def _staged(path: Path, clock: dict[str, float]) -> np.ndarray:
    """The exact path's pixels, stage by stage, each stage's seconds added to ``clock``."""
    t0 = time.perf_counter()
    data = read_file(path, max_bytes=MAX_BYTES, shown=str(path))
    t1 = time.perf_counter()
    if _jpeg_kind(data) in ("YCbCr", "Gray"):  # what pixels() does: RGBX wrapped without a copy
        array = simplejpeg.decode_jpeg(data, colorspace="RGBX")
        picture = Image.frombuffer("RGBX", (array.shape[1], array.shape[0]), array, "raw", "RGBX", 0, 1)
        t2 = t3 = time.perf_counter()
    else:
        picture = Image.open(io.BytesIO(data))
        picture.load()
        t2 = time.perf_counter()
        picture = picture if picture.mode == "RGB" else picture.convert("RGB")
        t3 = time.perf_counter()
    size = photo_before.shorter_side_size(picture.size, 256)
    picture = picture.resize(size, Image.Resampling.BILINEAR).crop(photo_before.centre_box(size, 224))
    array = np.asarray(picture, dtype=np.uint8)[:, :, :3]
    t4 = time.perf_counter()
    for stage, begin, end in (("read", t0, t1), ("decode", t1, t2), ("convert", t2, t3), ("resize", t3, t4)):
        clock[stage] += end - begin
    return array


def stages(paths: list[Path], encoders: dict[str, OnnxEncoder], scratch: Path) -> dict:
    """Milliseconds an image in each stage of the exact path (best of two passes), the encode once
    per graph in ``encoders`` (batches of the class's photos), the write an embedded store's upsert
    of one 128-d vector a point; and the images whose staged pixels differ from ``pixels()``."""
    best = None
    for _ in range(2):
        clock = dict.fromkeys(STAGES, 0.0)
        decoded = [_staged(p, clock) for p in paths]
        best = clock if best is None else {k: min(best[k], clock[k]) for k in STAGES}
    assert best is not None
    differ = [
        p.name for p, a in zip(paths, decoded, strict=True) if not np.array_equal(a, run_variant("exact", p))
    ]
    batch = np.stack(decoded)
    some = next(iter(encoders.values()))
    best["layout"] = min(_timed(lambda: some.layout(batch)) for _ in range(3))
    tensor = some.layout(batch)
    out = {k: v / len(paths) * 1e3 for k, v in best.items() if k not in ("encode", "write")}
    for name, encoder in encoders.items():
        encoder.run(tensor)  # warm up
        out[f"encode ({name})"] = (
            min(_timed(lambda e=encoder: e.run(tensor)) for _ in range(2)) / len(paths) * 1e3
        )
    out["write"] = _write_cost(len(paths), scratch) * 1e3
    return {"ms": out, "differ": differ}


def _timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _write_cost(count: int, scratch: Path) -> float:
    """Seconds a point of an embedded store's upsert of ``count`` 128-d vectors with a URI payload."""
    rng = np.random.default_rng(0)
    with open_store(scratch) as store:
        costs = []
        for attempt in range(3):
            name = f"write-{attempt}-{count}"
            store.create_collection(name, dim=128, distance="cosine")
            vectors = rng.normal(size=(count, 128)).astype(np.float32)
            payloads = [{"uri": f"/photos/{i}.jpg"} for i in range(count)]
            costs.append(
                _timed(lambda n=name, v=vectors, p=payloads: store.upsert(n, list(range(count)), v, p))
            )
            store.delete_collection(name)
    return min(costs) / count


def fidelity(paths: list[Path], encoder: OnnxEncoder, role: str) -> dict:
    """Before vs exact (images differing at all), fast vs exact (mean |Δ| levels a pixel, PSNR),
    and the cosines of ``encoder``'s vectors fast vs exact, and, for scale, exact vs exact
    perturbed: ±1 level of uniform noise, a 1-pixel shift (what the graph makes of changes
    no one would call a different photo)."""
    exact = np.stack([run_variant("exact", p) for p in paths])
    before = np.stack([run_variant("before", p) for p in paths])
    fast = np.stack([run_variant("fast", p) for p in paths])
    differ = [p.name for p, b, e in zip(paths, before, exact, strict=True) if not np.array_equal(b, e)]
    error = fast.astype(np.int16) - exact.astype(np.int16)
    delta = np.abs(error).reshape(len(paths), -1).mean(1)
    mse = np.maximum((error.astype(np.float64) ** 2).reshape(len(paths), -1).mean(1), 1e-12)
    noise = np.random.default_rng(0).integers(-1, 2, exact.shape)
    variants = {
        "exact": exact,
        "fast": fast,
        "noise": np.clip(exact + noise, 0, 255).astype(np.uint8),
        "shift": np.roll(exact, 1, axis=2),
    }
    vectors = {k: encoder.run_pixels(v, [role])[role] for k, v in variants.items()}
    unit = {k: v / np.linalg.norm(v, axis=1, keepdims=True) for k, v in vectors.items()}
    cosine = {k: (unit["exact"] * unit[k]).sum(1).tolist() for k in ("fast", "noise", "shift")}
    return {
        "differ": differ,
        "delta": delta.tolist(),
        "psnr": (10 * np.log10(255**2 / mse)).tolist(),
        "cosine": cosine["fast"],
        "cosine_noise": cosine["noise"],
        "cosine_shift": cosine["shift"],
        "exact_unit": unit["exact"],
    }


def encoder_ceiling(encoder: OnnxEncoder, batch: np.ndarray, repeats: int) -> float:
    """Images a second of ``encoder`` alone on decoded pixels (no I/O, no decode), best of ``repeats``."""
    encoder.run_pixels(batch)
    return len(batch) / min(_timed(lambda: encoder.run_pixels(batch)) for _ in range(max(1, repeats)))
