"""Settings from --set and YAML are checked against their declared types: one-line errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rm_qdrant.cli import cli
from train.config import BackboneConfig, HeadsConfig, load_config


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
    ],
)
def test_bad_settings_are_one_line(args, message):
    result = CliRunner().invoke(cli, ["train", "heads", *args])
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_rho_follows_the_paper_per_loss_unless_set():
    from train.config import rho_is_learned

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
