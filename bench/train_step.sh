#!/usr/bin/env bash
# Training-step benchmark, Stratum vs PyTorch (Debian python3-torch) in the same run:
# GPT-2 small, B=4, T=256, fp32, 2 threads. Prints both JSON lines and the ratios.
# PyTorch runs with OPENBLAS_CORETYPE unset so it is at its best; Stratum drops a forced core
# type itself. Usage: bash bench/train_step.sh [--steps N] [extra flags for both, e.g. --layers 2]
# Needs: bash tools/setup.sh --with-torch; a Release build in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target train_step_bench >/dev/null
steps=5
args=()
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
ours=$(env -u OPENBLAS_CORETYPE ./build/train_step_bench --steps "$steps" --threads 2 "${args[@]}")
echo "$ours"
keep=$(env -u OPENBLAS_CORETYPE ./build/train_step_bench --steps "$steps" --threads 2 --keep-activations 1 "${args[@]}")
echo "$keep"
theirs=$(env -u OPENBLAS_CORETYPE /usr/bin/python3 bench/pytorch_train_step.py --steps "$steps" --threads 2 "${args[@]}")
echo "$theirs"
/usr/bin/python3 - "$ours" "$keep" "$theirs" <<'PY'
import json, sys
runs = [json.loads(s) for s in sys.argv[1:]]
b = runs[-1]
for a in runs[:-1]:
    name = "stratum/" + a["activations"]
    print(f"{name:18s} {a['ms_per_step_median']:9.1f} ms/step {a['tokens_per_s']:8.1f} tok/s  peak RSS {a['peak_rss_mib']:7.1f} MiB  "
          f"MFU {100*a['mfu_vs_sgemm']:.1f}% of measured sgemm {a['sgemm_gflops']:.0f} GFLOP/s  "
          f"ratio vs pytorch: tokens/s {a['tokens_per_s']/b['tokens_per_s']:.2f}x, peak RSS {a['peak_rss_mib']/b['peak_rss_mib']:.2f}x")
print(f"{'pytorch':18s} {b['ms_per_step_median']:9.1f} ms/step {b['tokens_per_s']:8.1f} tok/s  peak RSS {b['peak_rss_mib']:7.1f} MiB")
PY
