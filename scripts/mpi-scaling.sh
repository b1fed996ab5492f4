#!/usr/bin/env bash
# Per-update time of data-parallel private training with 1 and 2 MPI ranks on this machine, and
# the bytes communicated per update (rank 0's payload), from the run records:
#
#     scripts/mpi-scaling.sh [config]      # default: examples/raptor-toy.toml
#
# Needs Open MPI (libopenmpi-dev openmpi-bin libclang-dev); builds raptor with `--features mpi`
# in release mode. Each rank uses one libtorch thread (OMP_NUM_THREADS=1), so 2 ranks use 2
# cores and the 1-rank baseline 1 core, as in the README table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cfg=$(realpath "${1:-examples/raptor-toy.toml}")
cargo build --release -p raptor --features mpi
out=$(mktemp -d)
export OMP_NUM_THREADS=1
(cd "$(dirname "$cfg")" && "$OLDPWD/target/release/raptor" train --json --config "$cfg" --runs-dir "$out/1") >"$out/1.json"
(cd "$(dirname "$cfg")" && mpirun --allow-run-as-root --oversubscribe -np 2 \
  "$OLDPWD/target/release/raptor" train --json --config "$cfg" --runs-dir "$out/2") >"$out/2.json"
python3 - "$out/1.json" "$out/2.json" <<'PY'
import json, sys
rows = [json.load(open(p)) for p in sys.argv[1:]]
base = None
print("| ranks | updates | updates/s | ms per update | speed-up | kB communicated per update (rank 0) | ε |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    ups = r["updates_per_second"]
    ms = 1e3 / ups if ups > 0 else float("nan")
    base = base or ms
    kb = r.get("communicated_bytes", 0) / 1e3 / max(r["updates"], 1)
    eps = (r.get("epsilon") or {}).get("upper", float("nan"))
    print(f"| {r['ranks']} | {r['updates']} | {ups:.2f} | {ms:.1f} | {base / ms:.2f}× | {kb:.1f} | {eps:.3f} |")
PY
