#!/usr/bin/env bash
# Mutation testing (cargo-mutants) of raptor's privacy-critical modules (results: docs/mutation-testing.md).
#
# Slow (minutes to an hour per target on two cores), so it is not part of `cargo xtask test`.
# Each target mutates the named files only and runs only the mutated crate's own tests
# (unit, integration and doc tests) against every mutant. The tch-free targets never build
# libtorch crates (the optional `tch` features stay off); the libtorch targets (models-*,
# trainer) need `cargo xtask setup` first. The scores are recorded in the README
# ("Privacy and reliability").
#
#   cargo install cargo-mutants          # the scores in the README were measured with 27.1.0
#   scripts/mutants.sh accountant        # ledger and sampler, then calibration
#   scripts/mutants.sh ledger            # ledger and sampler only
#   scripts/mutants.sh calibrate         # calibration only
#   scripts/mutants.sh accountant-prv    # the PRV accountant (about 2,500 mutants: a day)
#   scripts/mutants.sh clip              # privatizer and public denominator, clipping factors
#   scripts/mutants.sh clip-routed       # ragged kernels of routed expert rows (norms, gradients)
#   scripts/mutants.sh routing           # owner maps
#   scripts/mutants.sh models-owners     # libtorch: owner masks (raptor-models)
#   scripts/mutants.sh models-engine     # libtorch: the per-sample engine (raptor-models)
#   scripts/mutants.sh trainer           # libtorch: the trainer's release and accounting path
#   scripts/mutants.sh trainer-mpi       # libtorch + MPI: the data-parallel sample draw
#
# Environment: MUTANTS_JOBS (default 1), MUTANTS_TIMEOUT (seconds per test run, default 120),
# MUTANTS_OUT (default target/mutants), MUTANTS_TARGET_DIR (a cargo target folder shared by
# the scratch copies, so that the dependencies are built once rather than once per run; one
# per concurrent run; only with MUTANTS_JOBS=1). Extra arguments go to cargo mutants (e.g. `--list`).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_PROFILE_DEV_DEBUG=line-tables-only OMP_NUM_THREADS=1
# One shared target folder is only sound with one job: cargo-mutants' scratch copies of a
# workspace member build to the same artifact names, and cargo's mtime fingerprints then
# take one job's mutant binary as fresh for the other's (measured: a mutant reported
# missed that its test catches). With more jobs, each scratch copy builds in its own
# target folder (slower first builds, but each result is its own mutant's).
if [ "${MUTANTS_JOBS:-1}" != 1 ] && [ -n "${MUTANTS_TARGET_DIR:-}" ]; then
    echo "MUTANTS_TARGET_DIR needs MUTANTS_JOBS=1 (concurrent jobs would share stale artifacts)" >&2
    exit 2
fi
if [ -n "${MUTANTS_TARGET_DIR:-}" ]; then
    export CARGO_TARGET_DIR="$MUTANTS_TARGET_DIR"
fi
target=${1:?usage: scripts/mutants.sh accountant|accountant-prv|clip|clip-routed|routing|models-owners|models-engine|trainer|trainer-mpi [cargo-mutants args]}
shift
out=${MUTANTS_OUT:-target/mutants}
mkdir -p "$out"
common=(-j "${MUTANTS_JOBS:-1}" --timeout "${MUTANTS_TIMEOUT:-120}")
# The PRV unit test against direct convolution takes ~50 s and exercises prv.rs alone: it is
# skipped for the other accountant modules.
slow_prv=round_off_bound_covers_the_fft_error_against_direct_convolution
acc=crates/raptor-accountant/src
case "$target" in
accountant)
    "$0" ledger "$@"
    "$0" calibrate "$@"
    ;;
ledger)
    cargo mutants "${common[@]}" -o "$out/ledger" -p raptor-accountant \
        -f "$acc/ledger.rs" -f "$acc/sampling.rs" "$@" \
        -- -- --skip "$slow_prv"
    ;;
calibrate)
    # The tests that reach calibration: the unit tests, the plan and ledger tests, the
    # properties (calibration meets its target) and the error tests (the doc tests and the
    # golden PRV files do not calibrate).
    cargo mutants "${common[@]}" -o "$out/calibrate" -p raptor-accountant \
        -f "$acc/calibrate.rs" "$@" \
        -- --lib --test ledger_plan --test properties --test errors -- --skip "$slow_prv"
    ;;
accountant-prv)
    # All the crate's unit and integration tests (not the doc tests: examples of the public
    # API, slow to build per mutant), built optimized with debug checks on (profile
    # `mutants`): about 30 s per mutant instead of a minute. prv.rs has about 2,500 mutants:
    # a sample is measured with e.g. `--shard 0/20 --sharding round-robin` (every 20th).
    cargo mutants "${common[@]}" -o "$out/accountant-prv" -p raptor-accountant \
        --profile mutants -f "$acc/prv.rs" "$@" -- --lib --tests
    ;;
clip)
    # kernel.rs: only the functions that turn norms into factors and apply them; the rest of
    # it (schedules, cache budgets, SIMD sweeps) is covered by the kernel's agreement tests
    # but is not in this score. Tests per mutant: the unit tests and the slice and privatizer
    # integration tests (the schedule-planning tests and the doc tests are left out: they
    # take most of the time and test the schedule choice, not the privacy figures).
    cargo mutants "${common[@]}" -o "$out/clip" -p raptor-clip \
        -f crates/raptor-clip/src/privatizer.rs -f crates/raptor-clip/src/slice.rs \
        -f crates/raptor-clip/src/kernel.rs \
        --re 'privatizer\.rs|slice\.rs|clip_factor|factors_for_record|sums_skipping_non_finite' "$@" \
        -- --lib --test slice --test privatizer
    ;;
clip-routed)
    # The ragged kernels of routed expert rows (per-record gradients and ghost norms feeding
    # the clip factors of expert adapters): routed.rs and the two kernel functions it calls.
    cargo mutants "${common[@]}" -o "$out/clip-routed" -p raptor-clip \
        -f crates/raptor-clip/src/routed.rs -f crates/raptor-clip/src/kernel.rs \
        --re 'routed\.rs|outer_sum_rows|ghost_sq_rows' "$@" -- --lib
    ;;
routing)
    cargo mutants "${common[@]}" -o "$out/routing" -p raptor-routing \
        -f crates/raptor-routing/src/owner.rs "$@"
    ;;
models-owners | models-engine | trainer | trainer-mpi)
    # libtorch crates: the libtorch `cargo xtask setup` provisioned (target/libtorch) is linked
    # from a scratch target folder outside the tree (the scratch copies of cargo-mutants cannot
    # see the tree's target/), and found at run time through LD_LIBRARY_PATH.
    lt=$(readlink -f "${LIBTORCH:-target/libtorch}")
    [ -d "$lt/lib" ] || { echo "no libtorch at $lt: run cargo xtask setup first" >&2; exit 2; }
    export LIBTORCH="$lt" LD_LIBRARY_PATH="$lt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [ "${MUTANTS_JOBS:-1}" = 1 ]; then
        export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-/tmp/raptor-mutants-target}"
        mkdir -p "$CARGO_TARGET_DIR" && ln -sfn "$lt" "$CARGO_TARGET_DIR/libtorch"
    else
        unset CARGO_TARGET_DIR
    fi
    lib=(-j "${MUTANTS_JOBS:-1}" --timeout "${MUTANTS_TIMEOUT:-300}")
    exact=(--lib --test exact_switch --test exact_families --test exact_decoders)
    case "$target" in
    models-owners)
        # Owner masks: the routing collection and owner tensors, the owner-masked experts.
        cargo mutants "${lib[@]}" -o "$out/models-owners" -p raptor-models \
            -f crates/raptor-models/src/moe.rs -f crates/raptor-models/src/layers.rs \
            --re 'moe\.rs|owner_masked' "$@" -- "${exact[@]}"
        ;;
    models-engine)
        # The per-sample engine (norms, clipping, clipped sums, its cache and chunking).
        cargo mutants "${lib[@]}" -o "$out/models-engine" -p raptor-models \
            -f crates/raptor-models/src/grad.rs "$@" -- "${exact[@]}"
        ;;
    trainer)
        # The trainer's release and accounting path: one update (sampling, clipping groups,
        # releases, noise, denominators, ledger charges) and the plan's sensitivities.
        cargo mutants "${lib[@]}" -o "$out/trainer" -p raptor-train \
            -f crates/raptor-train/src/trainer/mod.rs -f crates/raptor-train/src/streams.rs \
            --re 'Trainer<.*>::(new|draw_sample|private_sums|release_and_charge)|Phase::sensitivity|Plan::(phase_at|phase_counts|check)' \
            "$@" -- --lib --test trainer_core
        ;;
    trainer-mpi)
        # The data-parallel branch of the sample draw (rank 0 samples and broadcasts): only a
        # run with two ranks reaches it, so these mutants run against the MPI tests
        # (`mpirun -np 2`; needs an MPI library, as `cargo xtask test` does). Replacing the
        # whole function is left to the `trainer` target: the MPI tests compare two ranks
        # with one process, which the replacement changes alike.
        cargo mutants "${lib[@]}" -o "$out/trainer-mpi" -p raptor-train --features mpi \
            -f crates/raptor-train/src/trainer/mod.rs --re 'Trainer<.*>::draw_sample' \
            --exclude-re 'draw_sample -> ' \
            "$@" -- --test mpi
        ;;
    esac
    ;;
*)
    echo "unknown target $target" >&2
    exit 2
    ;;
esac
