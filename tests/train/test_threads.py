"""``--threads`` of ``rmq train``, ``fit`` and ``demo``: the count chosen, applied, and bad values refused."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from rm_qdrant.cli import cli
from rm_qdrant_train.threads import choose_threads
from tests.conftest import one_error_line


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [
        (2, 0.1, 2),  # idle: one per core
        (2, 1.1, 1),  # a training job beside it: the free core only
        (2, 7.0, 1),  # overloaded: never fewer than one
        (16, 0.5, 4),  # idle and wide: at most 4
        (16, 13.6, 2),
    ],
)
def test_the_default_gives_one_thread_per_core_not_already_busy(cores, load, threads):
    assert choose_threads(None, environ={}, cores=cores, load=load).threads == threads


def test_threads_then_omp_num_threads_then_a_commands_own_default():
    env = {"OMP_NUM_THREADS": "3"}
    assert choose_threads(5, environ=env, cores=2, load=9.0).threads == 5
    assert choose_threads(None, environ=env, cores=2, load=9.0).threads == 3
    assert choose_threads(None, environ={"OMP_NUM_THREADS": "4,2"}, cores=2, load=0).threads == 4
    assert choose_threads(None, default=1, environ=env, cores=16, load=0).threads == 3
    assert choose_threads(None, default=1, environ={}, cores=16, load=0).threads == 1


def rmq(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "2147483648", "1_0"])
@pytest.mark.parametrize(
    "command",
    [
        ["train", "heads"],
        ["train", "backbone"],
        ["demo"],
        ["fit", "--name", "p", "--backbone", "pyproject.toml", "--out", "x.onnx"],
    ],
)
def test_a_bad_thread_count_is_one_line_and_exit_1(command, value):
    line = one_error_line(rmq(*command, "--threads", value))
    assert f"'--threads': expected a whole number of threads from 1 to 1024; got '{value}'" in line


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("abc", "≥ 1, got 'abc'"),
        ("1_0", "≥ 1, got '1_0'"),  # int() takes it, OpenMP does not
        ("2147483648", "from 1 to 1024, got 2147483648"),  # torch takes a C int
    ],
)
def test_a_bad_omp_num_threads_is_one_line_and_exit_1(value, said):
    line = one_error_line(rmq("train", "heads", "--old", "missing.pt", env={"OMP_NUM_THREADS": value}))
    assert line == f"Error: OMP_NUM_THREADS: expected a whole number of threads {said}"


def test_train_gives_torch_the_threads_asked_for(tmp_path):
    # The settings are refused after the threads are set: nothing trains, the count is applied.
    result = rmq("train", "heads", "--threads", "3", "--old", str(tmp_path / "missing.pt"))
    assert result.exit_code == 1
    assert torch.get_num_threads() == 3  # the conftest puts 1 back afterwards
