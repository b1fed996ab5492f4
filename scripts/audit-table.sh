#!/usr/bin/env bash
# The white-box audit table of the README ("An audit that can fail") and of
# crates/raptor-train/README.md ("Audit"): from the repository root,
#
#     scripts/audit-table.sh          # about two minutes on 2 CPU cores after the build
#
# runs the ignored test `audit::tests::audit_table` (the planted bugs are test-only code, so the
# table is made by a test), prints the commit, the machine and the Markdown rows to paste.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
start=$(date +%s)
OMP_NUM_THREADS=1 cargo test -q -p raptor-train --lib audit::tests::audit_table -- --ignored --nocapture 2>/dev/null \
  | grep -E '^(AUDIT TABLE|\|)'
echo "wall time: $(( $(date +%s) - start )) s"
