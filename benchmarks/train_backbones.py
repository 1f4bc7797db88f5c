"""Train the CIFAR-10 extended-class backbones (old: 5 classes, new: 10) and time them.

On a GPU this uses CUDA with bf16 mixed precision; on a CPU it runs as is. Writes
``old.pt``, ``new.pt`` (and ``new-resnet18.pt`` with ``--resnet18-epochs``) and
``timings.json`` into ``--out``; ``benchmarks/train_cifar.py --runs DIR`` reuses them.

Run: ``python benchmarks/train_backbones.py --out .cache/runs/extended-small-cnn-e20-s0 --epochs 20``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import cifar_root  # noqa: E402

from train.backbone import train_backbone  # noqa: E402
from train.config import BackboneConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--resnet18-epochs", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    jobs = [("old", "small-cnn", args.epochs, "old.pt"), ("new", "small-cnn", args.epochs, "new.pt")]
    if args.resnet18_epochs:
        jobs.append(("new", "resnet18", args.resnet18_epochs, "new-resnet18.pt"))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    timings = {"device": device, "torch": torch.__version__, "jobs": []}
    for role, arch, epochs, name in jobs:
        cfg = BackboneConfig(
            data=str(cifar_root()), out=str(out / name), arch=arch, role=role, epochs=epochs, batch=args.batch
        )
        started = time.perf_counter()
        path = train_backbone(cfg)
        seconds = time.perf_counter() - started
        top1 = torch.load(path, map_location="cpu", weights_only=False)["metric"]["top1"]
        timings["jobs"].append(
            {"role": role, "arch": arch, "epochs": epochs, "seconds": seconds, "top1": top1}
        )
        print(json.dumps(timings["jobs"][-1]), flush=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2))


if __name__ == "__main__":
    main()
