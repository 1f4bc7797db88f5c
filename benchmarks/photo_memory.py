"""Peak memory and time of decoding one hostile or large photo, exact and fast, each in its own process.

Each row runs ``rm_qdrant.models.images.pixels`` (the 224x224 input of a graph stamped
``--resize 256 --crop 224``) on one file in a fresh Python process: the peak of the
whole process (``wait4``: importing rm-qdrant and its libraries sets it), and the
decode's own peak over the memory the process held when it started (``VmHWM`` reset
through ``/proc/self/clear_refs``). A refused file prints its one-line reason.

Run: ``python benchmarks/photo_memory.py``
"""

from __future__ import annotations

import io
import math
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.hostile_images import png_declaring  # noqa: E402

CHILD = """
import sys
from rm_qdrant.errors import ImageError
from rm_qdrant.models.images import pixels
data = open(sys.argv[1], "rb").read()
def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))
before = kib("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on (Linux)
try:
    pixels(data, height=224, width=224, channels=3, resize=256, crop=224, decode=sys.argv[2],
           orientation=sys.argv[3])
    print((kib("VmHWM:") - before) / 1024, "decoded")
except ImageError as exc:
    print((kib("VmHWM:") - before) / 1024, f"refused: {exc}")
"""


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real small JPEG with its frame header rewritten to declare ``width`` x ``height``."""
    data = bytearray(encode(photo(64, 48), "JPEG", quality=90))
    at = data.index(b"\xff\xc0") + 5  # SOF0: length(2), precision(1), then height, width
    data[at : at + 4] = struct.pack(">HH", height, width)
    return bytes(data)


def photo(width: int, height: int) -> Image.Image:
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image("flower.jpg")).resize((width, height), Image.Resampling.BILINEAR)


def encode(picture: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()


def cases() -> dict[str, bytes]:
    big = photo(4000, 3000)
    jpeg = encode(big, "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6
    deep = np.asarray(big.convert("L"), dtype=np.uint16) * 257
    return {
        "baseline (32x32 JPEG)": encode(photo(32, 32), "JPEG"),
        "12 MP JPEG": jpeg,
        "12 MP progressive JPEG": encode(big, "JPEG", quality=90, progressive=True),
        "12 MP CMYK JPEG": encode(big.convert("CMYK"), "JPEG", quality=90),
        "12 MP JPEG, EXIF 6": encode(big, "JPEG", quality=90, exif=exif),
        "12 MP PNG": encode(big, "PNG", compress_level=1),
        "12 MP WebP": encode(big, "WEBP", quality=90),
        "12 MP 16-bit grey PNG": encode(Image.fromarray(deep), "PNG", compress_level=1),
        "12 MP JPEG, truncated at half": jpeg[: len(jpeg) // 2],
        "PNG declaring 100,000x100,000": png_declaring(100_000, 100_000, rows=64),
        "JPEG declaring 65,500x65,500": jpeg_declaring(65_500, 65_500),
    }


def run(path: Path, decode: str, orientation: str) -> tuple[float, float, float, str]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), decode, orientation], stdout=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read().strip() if proc.stdout else ""
    if status != 0:
        return time.perf_counter() - started, usage.ru_maxrss / 1024, math.nan, f"exit {status}"
    extra, outcome = out.split(" ", 1)
    return time.perf_counter() - started, usage.ru_maxrss / 1024, float(extra), outcome


def main() -> None:
    print(
        f"# photo_memory: `python benchmarks/photo_memory.py` ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})\n"
    )
    print("| file | bytes | decode | process peak RSS MiB | decode's peak over its start MiB | outcome |")
    print("|---|--:|---|--:|--:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in cases().items():
            path = Path(tmp) / "image"
            path.write_bytes(data)
            for decode in ("exact", "fast"):
                orientation = "exif" if "EXIF" in name else "ignore"
                _, peak, extra, outcome = run(path, decode, orientation)
                print(f"| {name} | {len(data):,} | {decode} | {peak:.0f} | {extra:.0f} | {outcome[:100]} |")


if __name__ == "__main__":
    main()
