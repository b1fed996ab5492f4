#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and driver, from the repository root,
#
#     scripts/gpu-check.sh            # about 10 minutes on one GPU after the first build
#
# installs the CUDA libtorch (cargo xtask setup --cuda), builds in release mode, runs the tests
# that use CUDA (each prints "skipped ..." where it cannot), a short RAPTOR and DP-Muon training
# on cuda:0, the per-update step bench, and prints one summary (GPU, commit, figures) to paste
# into the README's GPU section.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log=$(mktemp -d)/gpu-check
mkdir -p "$log"
summary=()
note() { summary+=("$1"); echo "==> $1"; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: nvidia-smi not found: this machine has no NVIDIA driver" >&2
  exit 2
fi
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
note "GPU: $gpu"
note "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

cargo xtask setup --cuda
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
cargo build --release -p raptor
./target/release/raptor info | tee "$log/info.txt"
grep -q "cuda available: true" "$log/info.txt" || { echo "gpu-check: libtorch sees no CUDA device" >&2; exit 1; }

# Tests that exercise CUDA where it is present (clip and Muon kernels on tensors, the models'
# libtorch smoke test, training on cuda vs cpu).
for t in "-p raptor-clip --features tch --test tch_backend" \
         "-p raptor-muon --features tch --test tch_backend" \
         "-p raptor-models --test libtorch_smoke" \
         "-p raptor --test cuda"; do
  # shellcheck disable=SC2086
  if cargo test --release $t -- --nocapture >"$log/test.txt" 2>&1; then
    note "tests ($t): ok $(grep -c '^test .* ok$' "$log/test.txt") passed; $(grep -c 'skipped' "$log/test.txt") skip lines"
  else
    tail -40 "$log/test.txt"; note "tests ($t): FAILED"; exit 1
  fi
done

# Short trainings on the GPU.
train() { # $1 = example config, $2 = extra sed expression
  local cfg="$log/$(basename "$1")"
  sed -e "s/^\[train\]/[train]\ndevice = \"cuda\"/" "$1" >"$cfg"
  (cd examples && ../target/release/raptor train --json --config "$cfg" --runs-dir "$log/runs") >"$log/rec.json"
  python3 - "$log/rec.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
e = r.get("epsilon") or {}
ev = r.get("eval") or {}
print(f"{r['method']} on {r['device']}: {r['updates']} updates, {r['updates_per_second']:.2f} updates/s, "
      f"eps {e.get('upper', float('nan')):.3f}, eval loss {ev.get('loss', float('nan')):.4f}")
PY
}
# The toy config ships with the repository; the E2E one reads ../shared/data when present.
note "$(train examples/raptor-toy.toml)"
if [ -e ../shared/data/e2e ]; then
  note "$(train examples/dp-muon-e2e.toml)"
else
  note "dp-muon-e2e: skipped (no ../shared/data/e2e beside the checkout)"
fi

# Per-update cost of every method (criterion, release profile) on cuda.
RAPTOR_BENCH_DEVICE=cuda cargo bench -p raptor-train --bench step -- --warm-up-time 1 --measurement-time 5 \
  2>&1 | tee "$log/bench.txt" | grep -E "time:|^step" || true
note "bench: $(grep -c 'time:' "$log/bench.txt") measurements in $log/bench.txt"

echo
echo "==== gpu-check summary ===="
printf '%s\n' "${summary[@]}"
