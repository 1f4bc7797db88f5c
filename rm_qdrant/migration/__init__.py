"""The backfill: ranking the gallery (ranking.py), a batch's images (loading.py), one run's
batches (migrator.py), the shards of ``rmq migrate`` (migrate.py), and the Ray engine
(ray_engine.py, ray_workers.py). Imports serving/, pair/ and below."""
