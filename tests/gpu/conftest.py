"""GPU tests: skipped without CUDA; they reuse the CPU tests' input builders."""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(__file__)
for folder in ("kernels", "ssm"):  # kernel_inputs.py, test_tree_scan.py (input builders)
    sys.path.insert(0, os.path.join(HERE, "..", folder))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tests/gpu); each path has a CPU test beside it")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
