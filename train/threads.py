"""How many CPU threads PyTorch may use in a training process (``--threads``, ``OMP_NUM_THREADS``).

PyTorch starts one intra-op thread per core. On a machine whose cores are already busy
(another training job, the tests, a CI neighbour) those threads wait on each other at
every parallel region, and a small step gets many times slower instead of faster.
Measured with ``benchmarks/threads.py`` (``benchmarks/results/threads.md``):

- a shared 2-core machine at load average 5.5 to 11: a ψ/ρ head step took 4 to 26 times
  longer on 2 threads than on 1 (1,748 ms against 67), a small-CNN batch of 64 images
  1.2 to 3.7 times longer;
- an idle 16-core machine (load 0.6): the head step gained 1.4× on 2 threads and 1.2× on 4,
  the small-CNN batch 2× on 2 and 3.1× on 4.

The default therefore gives each core that is not already busy one thread:
``cores − round(1-minute load average)``, at least 1 and at most 4. The load average
lags a load that has just started by up to a minute. ``OMP_NUM_THREADS``, when set to a
whole number ≥ 1, wins over that guess; ``--threads N`` wins over both; a command may fix
its own default instead (``rmq fit``: 1, see ``rm_qdrant.api.fitting.FIT_THREADS``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_DEFAULT = 4  # the default asks for no more: the small CNN gained 3.1x on 4, the heads nothing past 2


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count chosen and why (``rmq train -v`` logs it; ``fit`` and ``demo`` print it)."""

    threads: int
    reason: str


#: More threads than any CPU has (torch takes a C int, and crashed at exit with 100,000).
MAX_THREADS = 1024


def parse_threads(value: object, what: str = "--threads") -> int:
    """A thread count from the command line or the environment: a whole number ≥ 1.

    Raises:
        ValueError: anything else, in one line that names ``what``.
    """
    text = str(value).strip()
    if not text.isascii() or not text.lstrip("+").isdigit():  # int() would take "1_0"; OpenMP does not
        raise ValueError(f"{what}: expected a whole number of threads ≥ 1, got {text!r}")
    number = int(text)
    if not 1 <= number <= MAX_THREADS:
        raise ValueError(f"{what}: expected a whole number of threads from 1 to {MAX_THREADS}, got {number}")
    return number


def choose_threads(
    requested: int | None,
    *,
    default: int | None = None,
    environ: Mapping[str, str] | None = None,
    cores: int | None = None,
    load: float | None = None,
) -> ThreadChoice:
    """The thread count to use: ``requested``, else ``OMP_NUM_THREADS``, else one per idle core.

    Args:
        requested: ``--threads`` (None: not given).
        default: a fixed count instead of the guess from the load (``rmq fit``: 1, so that its
            graph does not depend on how busy the machine was).
        environ: the environment (default ``os.environ``); a bad ``OMP_NUM_THREADS`` is refused.
        cores: CPU cores this process may run on (default: its affinity mask).
        load: the 1-minute load average (default ``os.getloadavg()``; 0 where unknown).

    Raises:
        ValueError: ``OMP_NUM_THREADS`` is set but is not a whole number ≥ 1.

    Example:
        >>> choose_threads(None, environ={}, cores=2, load=1.1).threads
        1
    """
    if requested is not None:
        return ThreadChoice(parse_threads(requested), "--threads")
    env = os.environ if environ is None else environ
    if env.get("OMP_NUM_THREADS", "").strip():  # OpenMP's "4,2" (nested levels): the first
        first = env["OMP_NUM_THREADS"].split(",")[0]
        return ThreadChoice(parse_threads(first, "OMP_NUM_THREADS"), "OMP_NUM_THREADS")
    if default is not None:
        return ThreadChoice(default, "this command's default")
    cores = cores or _cores()
    load = _load() if load is None else load
    idle = cores - round(load)
    threads = max(1, min(MAX_DEFAULT, idle))
    return ThreadChoice(threads, f"{cores} cores, load average {load:.2f}")


def use_threads(requested: int | None = None, *, default: int | None = None) -> ThreadChoice:
    """Choose (:func:`choose_threads`) and apply (:func:`apply_threads`) the thread count.

    Raises:
        ValueError: a bad ``requested`` or ``OMP_NUM_THREADS``.
    """
    return apply_threads(choose_threads(requested, default=default))


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Give PyTorch ``choice.threads`` threads in this process.

    ``torch.set_num_interop_threads`` may be called once per process, before any inter-op
    work; where it is too late (a second call, the tests) it is left as it is.
    """
    import torch  # here: choosing (and refusing a bad value) stays torch-free

    torch.set_num_threads(choice.threads)
    try:
        torch.set_num_interop_threads(choice.threads)
    except RuntimeError:  # already set, or inter-op work already started: harmless
        pass
    log.debug("torch threads: %d (%s)", choice.threads, choice.reason)  # rmq train -v shows it
    return choice


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 0.0
