"""``-q`` and ``-v`` are rmq's own flags; a team writes them after the subcommand as often as before it."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.slow


def test_quiet_after_the_subcommand_hides_the_progress_as_before_it(rmq, demo):
    assert "migrating demo" in rmq("migrate", "--name", "demo", "--limit", 4).stderr
    for args in (["-q", "migrate"], ["migrate", "-q"], ["migrate", "--quiet"]):
        result = rmq(*args, "--name", "demo", "--limit", 4)
        assert "migrating demo" not in result.stderr, args


@pytest.fixture
def root_level():
    """The root logger's level, put back after the test (-v lowers it)."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def test_verbose_after_the_subcommand_logs_as_before_it(rmq, demo, caplog, root_level):
    def encoded() -> list[str]:  # -vv logs every batch's ids
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("encoded")]

    rmq("migrate", "--name", "demo", "--limit", 4)
    assert not encoded()
    rmq("migrate", "--name", "demo", "--limit", 4, "-v", "-v")
    assert len(encoded()) == 1


def test_a_group_s_commands_take_them_too(rmq, demo):
    assert rmq("pairs", "-q").exit_code == 0
    assert rmq("model", "check", "-v", "--help").exit_code == 0
