import os

# The Triton kernels are tested on the CPU through the interpreter, which must be switched on before
# any kernel module is imported (i.e. before multispec is imported anywhere).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
