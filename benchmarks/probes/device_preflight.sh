#!/usr/bin/env bash
# Before a device call, here: what would travel (tracked files present, untracked files git does not ignore, and
# the carried .whl) against the 64 MiB a call takes. The zoo's weights alone are over 90 MiB and neither the GPU
# tests nor real_sizes.py read them, so `--slim` takes them out of the working tree by a sparse checkout (git
# status stays clean; nothing is deleted from the repository) and `--restore` puts them back.
#
#   bash benchmarks/probes/device_preflight.sh [--slim | --restore]
set -eu
cd "$(git rev-parse --show-toplevel)"
case "${1:-}" in
    --slim) git sparse-checkout set --no-cone '/*' '!/multispec/zoo/weights/' ;;
    --restore) git sparse-checkout disable ;;
    "") ;;
    *) echo "usage: $0 [--slim | --restore]" >&2; exit 2 ;;
esac
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
wheels=$( (du -sb .whl 2>/dev/null || echo 0) | cut -f1)
total=$((tree + wheels))
limit=$((64 * 1048576))
awk -v t="$tree" -v w="$wheels" 'BEGIN {printf "working tree %.1f MiB + .whl %.1f MiB = %.1f MiB of 64 MiB\n", t / 1048576, w / 1048576, (t + w) / 1048576}'
if [ "$total" -gt "$limit" ]; then
    echo "over the limit: run with --slim first (and --restore after the call)"
    exit 1
fi
echo "fits"
