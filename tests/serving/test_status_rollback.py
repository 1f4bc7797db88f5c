"""``rmq status`` after a rollback says one thing: the old model serves every point."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_status_after_a_rollback_shows_no_estimate_of_a_merge(rmq, models, image_folder):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm,
        "--keep-old", "--old-encoder", models.old)  # fmt: skip
    rmq("probe", "--name", "demo", "--sample", 24)
    rmq("migrate", "--name", "demo", "--limit", 12)
    assert "% of it migrated" in rmq("status", "--name", "demo").output  # the backfill's estimate
    rmq("rollback", "--name", "demo")
    text = rmq("status", "--name", "demo").output
    assert "migrated      0.0%" in text
    assert "% of it migrated" not in text and "recall@" not in text
    assert "rolled back: the old model serves every point" in text
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["estimate"] is None
