import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (imports no Triton kernel: the switch below still takes effect)

# Without a GPU the Triton kernels are tested through the interpreter, which must be switched on before any
# kernel module is imported (i.e. before multispec is imported anywhere). With one, tests/gpu runs them
# compiled, and the interpreter-only tests skip themselves.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


import pytest  # noqa: E402


@pytest.fixture
def as_on_cuda(monkeypatch):
    """Checks on CPU tensors deferred to the step's read, as on CUDA (with `multispec.testing.CountReads`, a CPU
    test sees the host reads a CUDA run would wait on)."""
    import multispec.host as host
    import multispec.targets.hf as hf

    monkeypatch.setattr(host, "DEFERRED_DEVICE_TYPES", {"cuda", "cpu"})
    monkeypatch.setattr(hf, "DEFERRED_DEVICE_TYPES", {"cuda", "cpu"})
