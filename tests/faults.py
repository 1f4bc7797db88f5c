"""Test helpers that put a store's calls on a script: a user's write at a chosen moment, or a crash."""

from __future__ import annotations

from collections.abc import Callable

Step = tuple[str, Callable[[str, tuple, dict], bool], Callable[[], None]]
WRITES = frozenset(
    {
        "upsert",
        "delete",
        "mark",
        "set_payload",
        "set_vectors",
        "clear_fields",
        "create_collection",
        "delete_collection",
        "add_vector",
        "drop_vector",
        "set_alias",
    }
)


class Recording:
    """The real store, with every call it gets written down: (method, args, kwargs)."""

    def __init__(self, inner) -> None:
        self._inner, self.log = inner, []

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.log.append((name, args, kwargs))
            return attr(*args, **kwargs)

        return call


class Crash(BaseException):
    """A process dying at this point (a BaseException: no ``except Exception`` catches it)."""


class Scripted:
    """A store that runs actions at chosen moments of the calls made through it.

    Each step is (``"before"`` or ``"after"``, a test on (method, args, kwargs), an action);
    steps fire once each, in order. Everything else passes through to the real store.
    """

    def __init__(self, inner, steps: list[Step]) -> None:
        self._inner, self._steps = inner, list(steps)

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self._fire("before", name, args, kwargs)
            result = attr(*args, **kwargs)
            self._fire("after", name, args, kwargs)
            return result

        return call

    def _fire(self, when, name, args, kwargs):
        if self._steps and self._steps[0][0] == when and self._steps[0][1](name, args, kwargs):
            self._steps.pop(0)[2]()

    @property
    def pending(self) -> int:
        return len(self._steps)


def crash() -> None:
    raise Crash


def nth_write(n: int) -> Callable[[str, tuple, dict], bool]:
    """A step test that holds at the n-th store write (0-based) made through the script."""
    seen = [0]

    def test(name: str, args: tuple, kwargs: dict) -> bool:
        if name not in WRITES:
            return False
        seen[0] += 1
        return seen[0] == n + 1

    return test


def hammer_migration(store, ids, user_vector, **migrate):
    """Run a migration of pair ``p`` while a thread writes and deletes random points through
    DualIndex (400 writes at most, paced to spread over the run). Returns (report, last),
    ``last`` mapping each touched id to ``"deleted"`` or the version the user wrote last.

    The overlap does not depend on the machine's speed: after each settled batch the migration
    waits (up to 10 s) until the writer has made 3 more writes, so a fast migration cannot
    end before the writer has done its part."""
    import random
    import threading

    from rm_qdrant import DualIndex
    from rm_qdrant.migration.migrate import MigrateOptions, run_migration

    last: dict[object, object] = {}
    done = threading.Event()
    wrote = threading.Condition()
    writes = [0]

    def user() -> None:
        rng, index, version = random.Random(5), DualIndex.open(store, "p"), 0
        while not done.wait(0.001) and len(last) < 400:
            point = rng.choice(ids)
            if rng.random() < 0.7:
                version += 1
                index.upsert_vectors([point], user_vector(version), [{"version": version}])
                last[point] = version
            else:
                index.delete([point])
                last[point] = "deleted"
            with wrote:
                writes[0] += 1
                wrote.notify_all()

    def after_batch(_: object) -> None:
        with wrote:
            wanted = writes[0] + 3
            wrote.wait_for(lambda: writes[0] >= wanted or len(last) >= 400 or done.is_set(), timeout=10)

    thread = threading.Thread(target=user)
    thread.start()
    try:
        options = MigrateOptions(batch=50, fetch_workers=2)
        report = run_migration(DualIndex.open(store, "p"), options, on_batch=after_batch, **migrate)
    finally:
        done.set()
        thread.join()
    return report, last
