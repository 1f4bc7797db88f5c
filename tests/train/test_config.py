"""Settings from --set and YAML are checked against their declared types: one-line errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rm_qdrant.cli import cli
from rm_qdrant_train.config import BackboneConfig, HeadsConfig, heads_steps, load_config


def test_values_become_their_declared_type():
    cfg = load_config(HeadsConfig, lr="1e-3", epochs=5.0, out="runs/h.pt")
    assert (cfg.lr, cfg.epochs, cfg.out) == (0.001, 5, "runs/h.pt")
    assert load_config(BackboneConfig, epochs=3).epochs == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "lr=abc"], "setting lr: expected float, got 'abc'"),
        (["--set", "epochs=2.5"], "setting epochs: expected int, got 2.5"),
        (["--set", "learn_rho=maybe"], "setting learn_rho: expected bool, got 'maybe'"),
        (["--set", "nonsense=1"], "unknown setting(s) nonsense"),
        (["--set", "steps=1.5"], "setting steps: expected int, got 1.5"),
        (["--set", "steps=inf"], "setting steps: expected int, got 'inf'"),
        (["--set", "hard_mining=maybe"], "setting hard_mining: expected bool, got 'maybe'"),
        (["--lr", "abc"], "setting lr: expected float, got 'abc'"),
        (["--batch", "1.5"], "setting batch: expected int, got '1.5'"),
        (["--lr", "0"], "setting lr: expected a positive number, got 0.0"),
        (["--set", "lr=-1e-3"], "setting lr: expected a positive number, got -0.001"),
        (["--set", "lr=nan"], "setting lr: expected a positive number, got nan"),
        (["--steps", "0"], "setting steps: expected a positive integer, got 0"),
        (["--batch", "1"], "setting batch: expected 2 or more (BatchNorm needs two rows), got 1"),
        (["--epochs", "-1"], "setting epochs: expected 0 (use steps) or more, got -1"),
    ],
)
def test_bad_settings_are_one_line(args, message):
    result = CliRunner().invoke(cli, ["train", "heads", *args])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {message}")
    assert len(result.output.strip().splitlines()) == 1


def test_heads_train_by_steps_unless_epochs_are_set():
    cfg = load_config(HeadsConfig)
    assert (cfg.steps, cfg.epochs, cfg.batch, cfg.lr) == (3000, None, 256, 1e-3)
    assert heads_steps(cfg, steps_per_epoch=5) == 3000  # 1,280 images: still 3000 steps
    assert heads_steps(load_config(HeadsConfig, epochs=0), steps_per_epoch=5) == 3000
    assert heads_steps(load_config(HeadsConfig, epochs=50, steps=10), steps_per_epoch=5) == 250
    text = " ".join(CliRunner().invoke(cli, ["train", "heads", "--help"]).output.split())
    for option in ("--steps INTEGER", "--epochs INTEGER", "--batch INTEGER", "--lr FLOAT"):
        assert option in text


def test_rho_follows_the_paper_per_loss_unless_set():
    from rm_qdrant_train.config import rho_is_learned

    assert [rho_is_learned(HeadsConfig(loss=loss)) for loss in ("rqt", "cl-s", "cl-m", "mcl")] == [
        False,
        False,
        True,
        True,
    ]
    assert rho_is_learned(HeadsConfig(loss="rqt", learn_rho=True))
    assert not rho_is_learned(load_config(HeadsConfig, loss="mcl", learn_rho=False))
    text = CliRunner().invoke(cli, ["train", "heads", "--help"]).output
    assert "learned for cl-m and mcl" in " ".join(text.split())
