"""The sizing model of ``rmq plan`` (rm_qdrant/core/capacity.py): hand-computed cases for each
stage rule, properties a plan must keep (more of anything never plans slower, the bottleneck is
the slowest stage), and the storage arithmetic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rm_qdrant.core.capacity import Setup, Shapes, StageTimes, capacity, link_bytes, storage

TIMES = StageTimes(fetch=0.004, decode=0.002, encode=0.004, encode_core=0.005, write=0.001)


def rates(run) -> dict[str, float]:
    return {s.name: s.rate for s in run.stages}


def test_a_server_run_of_one_worker_is_bound_by_its_encoder():
    run = capacity(TIMES, Setup(cores=2, workers=1, fetch_threads=2, embedded=False))
    assert rates(run) == pytest.approx(
        {"fetch": 2 / 0.004, "decode": 2 / 0.002, "encode": 1 / 0.004, "cpu": 2 / 0.007, "write": 1 / 0.001}
    )
    assert run.bottleneck.name == "encode" and run.rate == pytest.approx(250)
    assert run.seconds(1000) == pytest.approx(4.0)
    assert run.seconds(0) == 0.0


def test_the_embedded_store_writes_one_batch_at_a_time_under_the_process_lock():
    run = capacity(TIMES, Setup(cores=8, workers=4, fetch_threads=2, embedded=True))
    assert rates(run)["write"] == pytest.approx(1 / 0.001)  # four workers, one store in the process
    assert "process" not in rates(run)  # heavy images: the lock is the write's alone
    server = capacity(TIMES, Setup(cores=8, workers=4, fetch_threads=2, embedded=False))
    assert rates(server)["write"] == pytest.approx(4 / 0.001) and "process" not in rates(server)


def test_light_images_fetch_and_decode_under_the_lock_of_the_local_engine_only():
    light = dataclasses.replace(TIMES, fetch=0.0001, decode=0.0002)
    local = capacity(light, Setup(cores=2, light_images=True))
    assert rates(local)["process"] == pytest.approx(1 / (0.001 + 0.0001 + 0.0002))
    server = capacity(light, Setup(cores=2, light_images=True, embedded=False))
    assert rates(server)["process"] == pytest.approx(1 / 0.0003)  # the writes run on the server
    ray = capacity(light, Setup(cores=2, encoders=1, light_images=True))
    assert "process" not in rates(ray)  # decoded in Ray's own processes


def test_ray_encoders_are_one_thread_sessions_bounded_by_the_cores():
    run = capacity(TIMES, Setup(cores=2, workers=1, fetch_threads=8, encoders=3, decoders=4, embedded=False))
    got = rates(run)
    assert got["encode"] == pytest.approx(2 / 0.005)  # three actors, two cores
    assert got["fetch"] == pytest.approx(4 * 8 / 0.004)  # decode tasks x their threads
    assert got["decode"] == pytest.approx(2 / 0.002)


def test_gpus_encode_at_their_rate_and_leave_the_cores_to_decoding():
    run = capacity(TIMES, Setup(cores=4, encoders=2, gpus=2, gpu_rate=3000.0, embedded=False))
    assert rates(run)["encode"] == pytest.approx(6000)
    assert rates(run)["cpu"] == pytest.approx(4 / 0.002)
    assert "GPU" in run.stages[2].limit


def test_a_stage_that_takes_no_time_bounds_nothing():
    run = capacity(dataclasses.replace(TIMES, fetch=0.0), Setup(cores=1, embedded=False))
    assert rates(run)["fetch"] == float("inf") and run.bottleneck.name != "fetch"


@pytest.mark.parametrize(
    "setup",
    [
        Setup(cores=0),
        Setup(cores=1, workers=0),
        Setup(cores=1, fetch_threads=0),
        Setup(cores=1, encoders=0),
        Setup(cores=1, gpus=1),
        Setup(cores=1, gpus=1, gpu_rate=0.0),
        Setup(cores=1, gpus=-1),
    ],
)
def test_a_setup_that_cannot_run_is_refused(setup):
    with pytest.raises(ValueError):
        capacity(TIMES, setup)


def random_case(rng: np.random.Generator) -> tuple[StageTimes, Setup]:
    times = StageTimes(*(float(x) for x in rng.uniform(1e-5, 1e-2, size=5)))
    ray = bool(rng.integers(2))
    gpus = int(rng.integers(0, 3))
    setup = Setup(
        cores=int(rng.integers(1, 33)),
        workers=int(rng.integers(1, 17)),
        fetch_threads=int(rng.integers(1, 9)),
        encoders=int(rng.integers(max(gpus, 1), 9)) if ray else None,
        decoders=int(rng.integers(1, 17)),
        gpus=gpus if ray else min(gpus, 1),
        gpu_rate=float(rng.uniform(100, 5000)),
        embedded=bool(rng.integers(2)),
        light_images=bool(rng.integers(2)),
    )
    return times, setup


@pytest.mark.parametrize("field", ["workers", "fetch_threads", "cores", "decoders", "encoders", "gpus"])
def test_more_of_anything_never_plans_slower(field):
    rng = np.random.default_rng(11)
    for _ in range(300):
        times, setup = random_case(rng)
        if getattr(setup, field) is None or (field == "gpus" and not (setup.ray and setup.gpus)):
            continue  # (from 0 GPUs to 1, the encoder moves off the CPU, which may be faster)
        more = dataclasses.replace(setup, **{field: getattr(setup, field) + 1})
        assert capacity(times, more).rate >= capacity(times, setup).rate - 1e-9, (times, setup, field)


def test_a_slower_stage_never_plans_faster_and_the_bottleneck_is_the_slowest_stage():
    rng = np.random.default_rng(12)
    for _ in range(300):
        times, setup = random_case(rng)
        run = capacity(times, setup)
        assert run.rate == min(s.rate for s in run.stages) == run.bottleneck.rate
        for name in ("fetch", "decode", "encode", "encode_core", "write"):
            slower = dataclasses.replace(times, **{name: getattr(times, name) * 2})
            assert capacity(slower, setup).rate <= run.rate + 1e-9
        assert run.seconds(2000) == pytest.approx(2 * run.seconds(1000))


def test_hnsw_links_at_m_16():
    assert link_bytes(16) == pytest.approx(4 * (32 + 16 / 15))  # 132 B a point
    with pytest.raises(ValueError):
        link_bytes(1)


def test_two_collections_copy_payloads_and_free_old_as_points_leave():
    shapes = Shapes(old_dim=64, new_dim=128, payload=100, old_payload=90, carried=16, m=16)
    grown = storage(1000, shapes)
    links = link_bytes(16)
    assert (grown.vectors, grown.payloads, grown.carried) == (512_000, 100_000, 16_000)
    assert grown.links == pytest.approx(1000 * links)
    assert grown.adds == grown.peak == pytest.approx(512_000 + 1000 * links + 100_000 + 16_000)
    old_point = 64 * 4 + links + 90 + 16
    assert grown.old_point == pytest.approx(old_point)
    assert grown.frees_during == pytest.approx(1000 * old_point) and grown.frees_at_finalize == 0
    assert grown.keep_old_would_hold == pytest.approx(1000 * old_point)


def test_keep_old_frees_nothing_until_finalize():
    grown = storage(1000, Shapes(old_dim=64, new_dim=128, payload=100, old_payload=90, keep_old=True))
    assert grown.frees_during == 0
    assert (
        grown.frees_at_finalize
        == grown.keep_old_would_hold
        == pytest.approx(1000 * (256 + link_bytes(16) + 90))
    )


def test_one_collection_adds_the_new_vector_and_copies_no_payload():
    grown = storage(
        1000, Shapes(old_dim=64, new_dim=128, payload=100, old_payload=90, carried=16, single=True)
    )
    assert (grown.payloads, grown.carried, grown.frees_during, grown.keep_old_would_hold) == (0, 0, 0, 0)
    assert grown.adds == pytest.approx(512_000 + 1000 * link_bytes(16))
    assert grown.frees_at_finalize == pytest.approx(1000 * (256 + link_bytes(16)))  # the old vector


def test_storage_of_no_point_is_nothing_and_of_fewer_is_refused():
    assert storage(0, Shapes(old_dim=4, new_dim=8)).adds == 0
    with pytest.raises(ValueError):
        storage(-1, Shapes(old_dim=4, new_dim=8))
