"""The embedded store's indexes kept built during a backfill (qdrant-edge has no background
optimizer): a migration optimises what it wrote at the end and at a bounded interval, and
``rm_qdrant.optimize`` does the same after a user's own writes; on qdrant-client a no-op."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

import rm_qdrant
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.api import optimize
from rm_qdrant.errors import CollectionNotFound, ConfigError
from rm_qdrant.pair.upkeep import IndexUpkeep
from rm_qdrant.store import Capabilities
from rm_qdrant.store.edge import EdgeStore
from tests.conftest import make_image_folder
from tests.faults import Recording

WRITES = {"upsert", "delete", "mark", "set_payload", "set_vectors", "clear_fields"}
LAYOUTS = [("paired", False), ("paired", True), ("single-collection", False)]


class Recorder(Recording):
    """The real store, with every call it gets written down."""

    @property
    def calls(self) -> list[tuple[str, str | None]]:
        """(method, collection) of each call."""
        return [(name, args[0] if args else None) for name, args, _ in self.log]

    def unbuilt(self) -> set[str]:
        """Searched collections written since their last optimisation (not rm-qdrant's records)."""
        dirty: set[str] = set()
        for name, collection in self.calls:
            if name in WRITES and collection != "rmq_meta":
                dirty.add(collection)
            elif name == "optimize":
                dirty.discard(collection)
        return dirty


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    return items


def make_pair(store, models, layout, keep_old):
    create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.rm),
        old_encoder=OnnxEncoder(models.old) if keep_old else None,
        keep_old=keep_old,
        layout=layout,
        new_vector="new" if layout == "single-collection" else None,
    )


@pytest.mark.parametrize(("layout", "keep_old"), LAYOUTS)
def test_a_migration_leaves_no_collection_written_since_its_last_build(
    store, models, gallery, layout, keep_old
):
    make_pair(store, models, layout, keep_old)
    spy = Recorder(store)
    report = rm_qdrant.migrate(spy, "p", batch=7, until=0.5)
    assert report.moved == 15
    optimized = [c for name, c in spy.calls if name == "optimize"]
    if isinstance(store, EdgeStore):
        assert spy.unbuilt() == set()
        assert set(optimized) == {"old", "p-new"} if layout == "paired" else {"old"}
        assert 0 < report.optimize_seconds <= report.seconds
    else:  # a server (or qdrant-client's local mode) optimises by itself
        assert optimized == [] and report.optimize_seconds == 0
    assert DualIndex.open(store, "p").count() == 30  # nothing lost or doubled by the builds


def test_builds_during_the_run_every_interval(store, models, gallery):
    """optimize_every=0: a build after each batch (as long as building stays under a tenth
    of the run), so no more than one batch is ever searched unindexed."""
    make_pair(store, models, "paired", False)
    spy = Recorder(store)
    rm_qdrant.migrate(spy, "p", batch=10, optimize_every=0)
    # rmq_meta's writes (the run's progress, written last) are no searched collection's
    names = [n for n, c in spy.calls if n == "optimize" or (n in WRITES and c != "rmq_meta")]
    builds = names.count("optimize")
    if isinstance(store, EdgeStore):
        assert builds >= 2 * 2  # the end's, and at least one more for each collection
        assert names[-1] == "optimize"
    else:
        assert builds == 0


def test_optimize_every_takes_seconds_or_none(store, models, gallery):
    make_pair(store, models, "paired", False)
    with pytest.raises(ConfigError, match="optimize_every"):
        rm_qdrant.migrate(store, "p", optimize_every=-1)
    spy = Recorder(store)
    rm_qdrant.migrate(spy, "p", batch=10, optimize_every=None)
    ends = [c for name, c in spy.calls if name == "optimize"]
    assert ends == (["p-new", "old"] if isinstance(store, EdgeStore) else [])


@pytest.mark.parametrize(("layout", "keep_old"), LAYOUTS)
def test_optimize_builds_a_pairs_collections_after_a_users_writes(store, models, gallery, layout, keep_old):
    make_pair(store, models, layout, keep_old)
    rm_qdrant.migrate(store, "p", until=0.5)
    spy = Recorder(store)
    with DualIndex.open(spy, "p") as index:
        index.upsert([10_001], [gallery[0].uri])
        index.delete([gallery[1].point_id])
    done = optimize(spy, "p")
    if isinstance(store, EdgeStore):
        assert spy.unbuilt() == set()
        assert done == (["old", "p-new"] if layout == "paired" else ["old"])
        assert optimize(spy, "old") == ["old"]
    else:
        assert done == [] and optimize(spy, "old") == []
    with pytest.raises(CollectionNotFound, match="no pair and no collection named 'nope'"):
        optimize(store, "nope")


class FakeStore:
    """A store whose build takes ``cost`` seconds of a fake clock."""

    capabilities = Capabilities(optimizes=True)

    def __init__(self, clock: list[float], cost: float) -> None:
        self.clock, self.cost, self.built = clock, cost, []

    def optimize(self, name: str) -> None:
        self.built.append((self.clock[0], name))
        self.clock[0] += self.cost


@pytest.mark.parametrize(
    ("every", "cost", "expected"), [(30, 1, [30, 61, 92]), (30, 5, [30, 85]), (None, 1, [])]
)
def test_builds_come_every_interval_stretched_to_ten_times_their_cost(every, cost, expected):
    now = [0.0]
    store = FakeStore(now, cost)
    upkeep = IndexUpkeep(store, ["a"], every=every, clock=lambda: now[0])
    while now[0] < 100:
        upkeep.written()  # a batch every second
        now[0] += 1
    assert [t for t, _ in store.built] == expected
    upkeep.finish()
    assert len(store.built) == len(expected) + 1  # the end's build
    upkeep.finish()
    assert len(store.built) == len(expected) + 1  # nothing written since: no build


def test_a_store_that_builds_by_itself_is_left_alone():
    builds_by_itself = SimpleNamespace(capabilities=Capabilities(optimizes=False))
    upkeep = IndexUpkeep(builds_by_itself, ["a"], every=0)
    upkeep.written()
    upkeep.finish()
    assert upkeep.runs == 0 and upkeep.seconds == 0


def test_a_stopped_run_ends_at_once_and_leaves_the_build_to_the_next(store, models, gallery):
    """Ctrl-C or SIGTERM stops after the batch in flight; a build could take minutes on a large
    collection, so the stopped run skips it and the next run (or optimize) builds."""
    make_pair(store, models, "paired", False)
    spy = Recorder(store)
    stop = threading.Event()
    report = rm_qdrant.migrate(
        spy, "p", batch=7, optimize_every=None, stop=stop, on_batch=lambda _: stop.set()
    )
    assert report.stopped_early and [c for name, c in spy.calls if name == "optimize"] == []
    rest = Recorder(store)
    rm_qdrant.migrate(rest, "p", batch=7, optimize_every=None)
    assert rest.unbuilt() == set() if isinstance(store, EdgeStore) else True


@pytest.mark.slow
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_rmq_migrate_optimize_every_refuses_what_is_not_seconds_or_end(rmq, models, image_folder, value):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "p", "--old-collection", "gallery", "--encoder", models.rm)
    bad = rmq("migrate", "--name", "p", "--optimize-every", value, ok=False)
    assert (
        bad.exit_code == 1
        and "--optimize-every takes seconds" in bad.output
        and "Traceback" not in bad.output
    )
    report = json.loads(rmq("migrate", "--name", "p", "--optimize-every", "end", "--json").output)
    assert report["moved"] == 24 and report["optimize_seconds"] > 0  # the end's build, on the embedded store
