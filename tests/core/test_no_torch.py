"""The runtime must import and run where torch is not installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked for this test")
        return None
sys.meta_path.insert(0, NoTorch())
import rm_qdrant, rm_qdrant.cli, rm_qdrant.store.edge, rm_qdrant.store.client, rm_qdrant.models.encoder
assert "torch" not in sys.modules
print("ok")
"""


def test_runtime_imports_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
