#!/usr/bin/env bash
# The planned device call (docs/benchmarks/gpu.md, "Real sizes, acceptance set"), about 8 minutes on an H100/H200:
# the GPU tests, then the real-size bench, its figures under $OUT (default ./device_out). Carried wheels in .whl
# (transformers 5.24 for the state-space rows: the device has 5.17) are installed first when present.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 240 python3 -m pytest tests/gpu -x -q -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: exit $?" >> "$OUT/gpu_tests.txt"
timeout 180 python3 benchmarks/probes/real_sizes.py --shapes llama3-8b --batches 1,8 --chains 2,4,8 \
    --acceptances 0.6,0.8,0.9 --rounds 2 --json "$OUT/real_sizes_llama.json" > "$OUT/real_sizes_llama.txt" 2>&1
timeout 150 python3 benchmarks/probes/real_sizes.py --shapes qwen2.5-vl-7b-lm,janus-pro-7b-gpt,mamba2-2.7b,bamba-9b \
    --batches 1 --chains 4 --acceptances 0.8 --rounds 2 --json "$OUT/real_sizes_others.json" \
    > "$OUT/real_sizes_others.txt" 2>&1
tail -n 3 "$OUT"/*.txt
