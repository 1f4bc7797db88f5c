"""``rmq fit`` and ``rmq probe`` on a pair with nothing left to migrate say so, and what they need.

The points left in old are the ones whose image failed: before, a fit sampled them and blamed
"the payload uris"; a pair with none left said its old collection "holds 0 point(s)", also
where keep-old held every migrated point there."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("keep_old", [False, True])
def test_fit_and_probe_on_a_migrated_pair_say_what_they_need(rmq, models, image_folder, tmp_path, keep_old):
    pytest.importorskip("torch", reason="rmq fit needs the train extra")
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    kept = ["--keep-old", "--old-encoder", models.old] if keep_old else []
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm, *kept)
    gone = sorted(image_folder.rglob("*.*"))[:2]
    for image in gone:  # two images a migration cannot read: their points stay in old, marked failed
        image.unlink()
    report = json.loads(rmq("migrate", "--name", "demo", "--max-failures", 0.5, "--json").output)
    assert report["failed"] == 2 and report["moved"] == 22
    out = tmp_path / "fitted.onnx"
    fit = ["fit", "--name", "demo", "--backbone", models.new_only, "--out", out, "--sample", 8]
    for command in (fit, ["probe", "--name", "demo", "--sample", 8]):
        result = rmq(*command, ok=False)
        assert result.exit_code == 1 and "Traceback" not in result.output
        line = result.stderr.strip()
        assert "payload uris" not in line and "holds 0" not in line
        assert "no point left to migrate and 2 whose image" in line and "rmq failures --name demo" in line
        assert "needs at least 2" in line and "rmq finalize --name demo" in line
    assert not out.exists()
