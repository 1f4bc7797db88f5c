"""The export tests share the training tests' fixtures (a tiny image folder, one CPU thread)."""

from tests.train.conftest import one_thread, tiny_folder  # noqa: F401
