"""What hostile images cost a migration: peak memory and time of ``rmq migrate`` as a process.

Sixteen of 64 gallery points point at one image; each row is one ``rmq migrate`` run
on a fresh embedded store (the other 48 are 8x8 PNGs), measured with ``wait4``:

- ``100-MP PNG``: a 290 KB PNG whose header declares 10,000 x 10,000 pixels (the
  issue's case, 3.2 GB peak before the pixel cap);
- ``36-MP JPEG``: a real 6,000 x 6,000 photo-sized JPEG, under the default
  ``--max-pixels`` (40 M), decoded for real: the cost of a legitimate large image;
- ``8x8 PNG``: the baseline.

Run: ``python benchmarks/hostile_images.py``
"""

from __future__ import annotations

import io
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from rm_qdrant import InputSpec, open_store
from rm_qdrant_exporters.linear import linear_encoder

SPEC = InputSpec(height=8, width=8, channels=3)


def png_declaring(width: int, height: int, rows: int | None = None) -> bytes:
    """An RGB PNG whose header declares ``width`` x ``height``, with ``rows`` black rows of pixel
    data (default: all of them; fewer: a decompression bomb's header on a small file)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = zlib.compress(b"\x00" * ((width * 3 + 1) * (height if rows is None else rows)), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def png_100mp() -> bytes:
    return png_declaring(10_000, 10_000)


def jpeg(size: int) -> bytes:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, size=(size // 100, size // 100, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(small).resize((size, size)).save(out, "JPEG", quality=85)
    return out.getvalue()


def rmq(store: Path, *args: str) -> tuple[float, float, str]:
    """Run one rmq command; return (seconds, peak RSS in MiB, stdout)."""
    cmd = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store), *args]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    out = proc.stdout.read() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"rmq {' '.join(args)} failed: {proc.stderr.read() if proc.stderr else ''}")
    return seconds, usage.ru_maxrss / 1024, out


def row(folder: Path, name: str, data: bytes, models: tuple[Path, Path]) -> dict[str, object]:
    images = folder / name / "images"
    rng = np.random.default_rng(1)
    for i in range(64):
        target = images / "a" / f"{i:03d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)).save(target)
    store = folder / name / "qdrant"
    rmq(store, "index", "--collection", "old", "--data", str(images), "--encoder", str(models[0]))
    rmq(store, "init", "--name", "p", "--old-collection", "old", "--encoder", str(models[1]))
    hostile = folder / name / "hostile.img"
    hostile.write_bytes(data)
    with open_store(store) as opened:
        ids = [r.id for r in opened.scroll("old", limit=16)[0]]
        opened.set_payload("old", [(i, {"uri": str(hostile)}) for i in ids])
    seconds, peak, out = rmq(store, "migrate", "--name", "p", "--batch", "100", "--json")
    report = json.loads(out)
    return {
        "image": name,
        "file": f"{len(data) / 1024:,.1f} KiB",
        "moved": report["moved"],
        "failed": report["failed"],
        "reason": report["failure_sample"][0][1].rsplit(": ", 1)[-1] if report["failure_sample"] else "-",
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(peak),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rng = np.random.default_rng(7)
        old = linear_encoder(
            folder / "old.onnx",
            [("embedding", "pixels", rng.normal(size=(192, 6)))],
            input_spec=SPEC,
            name="old",
        )
        w_new = rng.normal(size=(192, 10))
        rm = linear_encoder(
            folder / "rm.onnx",
            [("new", "pixels", w_new), ("rev", "new", rng.normal(size=(10, 6)))],
            input_spec=SPEC,
            name="rm",
        )
        small = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)).save(small, "PNG")
        rows = [
            row(folder, name, data, (old, rm))
            for name, data in (
                ("8x8 PNG", small.getvalue()),
                ("100-MP PNG", png_100mp()),
                ("36-MP JPEG", jpeg(6000)),
            )
        ]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    print(f"rmq migrate over 64 points, 16 of them pointing at one image ({machine})\n")
    print("| image (16 points) | file | moved | failed | reason | seconds | peak RSS |")
    print("|---|--:|--:|--:|---|--:|--:|")
    for r in rows:
        print(
            f"| {r['image']} | {r['file']} | {r['moved']} | {r['failed']} | {r['reason']} | "
            f"{r['seconds']} | {r['peak_rss_mib']} MiB |"
        )


if __name__ == "__main__":
    main()
