#!/usr/bin/env bash
# The white-box audit table of the README ("An audit that can fail") and of
# crates/raptor-audit/README.md: from the repository root,
#
#     scripts/audit-table.sh [--canaries M] [--seeds a,b,c] [--rows paired|split]   # minutes on 2 CPU cores
#
# builds and runs the example `audit_table` of raptor-audit with the test/audit-only feature
# `planted-faults` (the planted noise bugs; the `raptor` program is never built with it), and
# prints the commit, the machine and the Markdown rows to paste.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cargo build -q -p raptor-audit --example audit_table --features planted-faults
start=$(date +%s)
OMP_NUM_THREADS=1 cargo run -q -p raptor-audit --example audit_table --features planted-faults -- "$@" \
  | grep -E '^(AUDIT TABLE|\|)'
echo "wall time: $(( $(date +%s) - start )) s (dev profile)"
