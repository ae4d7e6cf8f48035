#!/usr/bin/env bash
# The planned device call (docs/benchmarks/gpu.md, "Real sizes, acceptance set"), 8 minutes at most on an H100/H200:
# the GPU tests, then the real-size bench, its figures under $OUT (default ./device_out).
#
# Before the call, here (the device has no network and lacks some of the project's needs: transformers 5.17 where
# the state-space rows need 5.24, no diffusers, no mlxtend):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0 diffusers==0.42.1 mlxtend==0.25.0 \
#       setuptools==80.9.0 wheel==0.45.1
# then `bash benchmarks/probes/device_preflight.sh --slim` (the zoo's weights, which nothing here reads, out of the
# working tree: the tracked tree is over the 64 MiB a call takes), and run with `carry: [".whl"]`, command
# `OUT=$OUT bash benchmarks/probes/device_call.sh`, timeout_s 600; after it, `device_preflight.sh --restore`.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
LOG="$OUT/install.txt"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$LOG" 2>&1 && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# the project itself, editable: its modality packages live beside multispec/ (pyproject's package-dir) and register
# through entry points, neither of which PYTHONPATH=. gives
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >> "$LOG" 2>&1 || echo "editable install failed" >> "$LOG"
python3 -c "import transformers, diffusers, multispec.image_ar, multispec.ssm, multispec.vision, multispec.reasoning
print('imports ok: transformers', transformers.__version__, 'diffusers', diffusers.__version__)" >> "$LOG" 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 210 python3 -m pytest tests/gpu --maxfail=10 -v -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1  # -v: a timeout still names what ran
echo "gpu tests: exit $?" >> "$OUT/gpu_tests.txt"
timeout 150 python3 benchmarks/probes/real_sizes.py --shapes llama3-8b --batches 1,8 --chains 2,4,8 \
    --acceptances 0.6,0.8,0.9 --rounds 2 --json "$OUT/real_sizes_llama.json" > "$OUT/real_sizes_llama.txt" 2>&1
timeout 120 python3 benchmarks/probes/real_sizes.py --shapes qwen2.5-vl-7b-lm,janus-pro-7b-gpt,mamba2-2.7b,bamba-9b \
    --batches 1 --chains 4 --acceptances 0.8 --rounds 2 --json "$OUT/real_sizes_others.json" \
    > "$OUT/real_sizes_others.txt" 2>&1
tail -n 3 "$OUT"/*.txt
