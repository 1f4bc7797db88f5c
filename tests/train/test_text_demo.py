"""``rmq demo --text``'s run on a small part of the bundled corpus, with the real pair: the
curves start at the old model and end at the new one for every system, and the CLI refuses
what it cannot take."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rm_qdrant.cli import cli
from rm_qdrant.errors import ConfigError

pytestmark = pytest.mark.slow


def test_the_text_demo_serves_each_system_from_old_to_new(tmp_path):
    from rm_qdrant.evaluation.text_corpus import text_demo_models
    from rm_qdrant_train.text_demo import SYSTEMS, DemoSize, run_text_demo

    try:
        text_demo_models()
    except ConfigError as exc:
        pytest.skip(str(exc))
    stages = []
    size = DemoSize(gallery_per_class=12, queries_per_class=2, sample=240)
    demo = run_text_demo(tmp_path / "demo", size=size, on_stage=stages.append)
    assert [round(r.t, 1) for r in demo.rows] == [round(0.1 * i, 1) for i in range(11)]
    first, last = demo.rows[0], demo.rows[-1]
    # nothing migrated: the naive merges and RRF serve the old model alone; all migrated: the new
    assert first.naive == first.calibrated == first.rrf
    assert last.naive == last.calibrated == last.rrf == last.fit
    assert all(0.0 <= getattr(r, s) <= 1.0 for r in demo.rows for s in SYSTEMS)
    assert len(demo.notes) == 2 and any("fit" in n for n in demo.notes)
    assert any("rmq fit naive --loss procrustes" in s for s in stages)
    assert (tmp_path / "demo" / "fit.onnx").is_file()


def test_demo_text_takes_no_data_folder(tmp_path):
    result = CliRunner().invoke(
        cli, ["demo", "--text", "--data", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code != 0 and "--text runs on the bundled corpus: drop --data" in result.output
