"""A user's own train.py or exporters.py (the commonest names in an ML project) hides nothing of rmq's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MARKER = "THE USER'S OWN MODULE WAS IMPORTED"

COMMANDS = [
    ["train", "--help"],
    ["train", "backbone", "--help"],
    ["train", "heads", "--help"],
    ["train", "adapter", "--help"],
    ["train", "baseline", "--help"],
    ["fit", "--help"],
    ["export", "--help"],
    ["demo", "--help"],
]

IMPORT_ALL = """
import importlib, pkgutil
import rm_qdrant_exporters, rm_qdrant_train
for package in (rm_qdrant_train, rm_qdrant_exporters):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
"""

# Each command as ``rmq`` runs it, in one process (as python -m and python -c do, the working
# folder is first on sys.path): what a user's train.py would hide, it hides here too.
EVERY_COMMAND = """
import sys
from rm_qdrant.cli import cli
for args in COMMANDS:
    try:
        cli(args, prog_name="rmq")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder as a user's ML project has it: its own train.py and exporters.py."""
    for name in ("train", "exporters"):
        (tmp_path / f"{name}.py").write_text(f"import sys\nprint({MARKER!r}, file=sys.stderr)\n")
    return tmp_path


def run_side_by_side(runs: list[tuple[list[str], dict[str, str]]], cwd: Path) -> list[tuple]:
    """(command, exit status, stdout, stderr) of each run; they only start Python, so all at once."""
    started = [
        (command, subprocess.Popen(command, cwd=cwd, env=env, stdout=-1, stderr=-1, text=True))
        for command, env in runs
    ]
    done = []
    for command, process in started:
        out, err = process.communicate(timeout=120)
        done.append((command, process.returncode, out, err))
    return done


@pytest.mark.slow
def test_training_commands_and_modules_ignore_the_users_train_py(project: Path):
    rmq = str(Path(sys.executable).with_name("rmq"))  # the console script pip installed
    here = dict(os.environ)
    # python -m and python -c put the working folder first on sys.path; PYTHONPATH (or a
    # notebook's folder) does the same for rmq
    on_path = {**here, "PYTHONPATH": os.pathsep.join(filter(None, [str(project), here.get("PYTHONPATH")]))}
    every = f"COMMANDS = {COMMANDS!r}\n{EVERY_COMMAND}\n{IMPORT_ALL}"
    runs = [
        ([sys.executable, "-m", "rm_qdrant", "train", "heads", "--help"], here),  # the issue's own command
        ([rmq, "fit", "--help"], on_path),
        ([sys.executable, "-c", every], here),
    ]
    for command, status, out, err in run_side_by_side(runs, project):
        assert (status, MARKER in err, "Traceback" in err) == (0, False, False), (command, err)
        assert out.count("Usage:") == (len(COMMANDS) if command[1] == "-c" else 1), (command, out)


def test_the_package_list_names_every_package_folder():
    """pyproject lists packages (discovery would install train/ as ``train``): none left out."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"rm_qdrant": "rm_qdrant", **setuptools["package-dir"]}
    found = {
        ".".join((name, *init.parent.relative_to(root / folder).parts))
        for name, folder in folders.items()
        for init in (root / folder).rglob("__init__.py")
    }
    assert sorted(setuptools["packages"]) == sorted(found)
