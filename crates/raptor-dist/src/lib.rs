//! # raptor-dist
//!
//! Data-parallel private training: the collective operations raptor's trainer needs, on one
//! process ([`Solo`]) or over MPI (`Mpi`, cargo feature `mpi`), with what an MPI launcher's
//! environment says (rank, size) and fault injection for the tests of the failure path. No
//! libtorch: buffers are plain `f32` / `f64` / `u64` slices (raptor-train flattens its tensors
//! into them).
//!
//! One private update over K ranks, as raptor-train's trainer runs it:
//!
//! 1. rank 0 draws the Poisson sample with its (secure) sampler and the step's dropout seed, and
//!    broadcasts both (record ids and one `u64`);
//! 2. rank r computes the clipped per-record gradient sums of the sampled records at positions
//!    r, r + K, r + 2K, … of the sample (each record is clipped exactly as on one process: its
//!    contribution to every release is still bounded by its clip bound);
//! 3. one all-reduce (sum) of the concatenated sums of every parameter the phase releases (all
//!    expert streams of RAPTOR included: one buffer, not one all-reduce per expert), plus one
//!    small all-reduce of the non-private diagnostics (loss sum, clip counts, owner counts);
//! 4. rank 0 adds the noise once (never K noises, never noise divided by K) and divides by the
//!    public denominator; the released gradients are broadcast from rank 0 in one buffer;
//! 5. every rank charges the same ledger (only rank 0 writes it) and applies the same optimizer
//!    step to the same released gradient, so the parameters stay identical on every rank.
//!
//! The mechanism, and therefore the accounting, is the one of a single process: the same
//! records are sampled with the same probability, each clipped to the same bound, and one
//! Gaussian noise is added per release.

mod error;
pub use error::{DistError, Result};

/// Counts of what crossed the wire (for the per-step cost report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Collective calls made.
    pub calls: u64,
    /// Payload bytes this rank sent or received in them (a broadcast counts its buffer once, an
    /// all-reduce its buffer once).
    pub bytes: u64,
}

/// The collective operations of data-parallel training. Every rank calls the same operations
/// in the same order; rank 0 is the root of every broadcast.
pub trait Collective {
    /// This process's rank (0-based).
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Broadcast a variable-length list of `u64` from rank 0 (on other ranks `buf` is replaced).
    fn broadcast_u64(&self, buf: &mut Vec<u64>) -> Result<()>;
    /// Broadcast `buf` (same length on every rank) from rank 0.
    fn broadcast_f32(&self, buf: &mut [f32]) -> Result<()>;
    /// Sum `buf` element-wise over all ranks; every rank gets the sum.
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;
    /// Sum `buf` element-wise over all ranks; every rank gets the sum.
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    /// What this rank has communicated so far.
    fn stats(&self) -> CommStats;
    /// End the whole job now with `code` (every rank), after an error on this rank: the other
    /// ranks would otherwise wait forever in the next collective.
    fn abort(&self, code: i32) -> !;
    /// Is this the rank that writes files (the ledger, checkpoints, records)?
    fn is_writer(&self) -> bool {
        self.rank() == 0
    }
}

/// One process: every operation is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn broadcast_u64(&self, _buf: &mut Vec<u64>) -> Result<()> {
        Ok(())
    }
    fn broadcast_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn stats(&self) -> CommStats {
        CommStats::default()
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// Was this process started by an MPI launcher (`mpirun`/`mpiexec` of Open MPI or MPICH, or
/// Slurm's `srun` with PMI/PMIx)? Read from the environment the launchers set.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The number of processes the launcher started (1 when not launched by MPI).
pub fn launcher_size() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(1)
}

/// Fault injection for the tests of the failure path (and for anyone checking their cluster's
/// behaviour): with `RAPTOR_MPI_FAULT=<rank>:<update>` in the environment, that rank exits
/// abruptly (status 3, without finalizing MPI, as a crashed process would) just before that
/// update; with `RAPTOR_MPI_FAULT=<rank>:<update>:panic` it panics there instead (a bug in the
/// program, as opposed to a crash), which the panic hook installed by `Mpi::init` turns into
/// `MPI_Abort`. Either way the whole job ends with a non-zero status; the checkpoint rank 0
/// wrote before stays intact.
#[cfg(feature = "mpi")]
pub fn fault_injection(comm: &dyn Collective, update: u64) {
    let Ok(spec) = std::env::var("RAPTOR_MPI_FAULT") else {
        return;
    };
    let mut it = spec.split(':').map(str::trim);
    let mut num = || it.next().and_then(|x| x.parse::<u64>().ok());
    let (rank, at) = (num(), num());
    let panics = spec.split(':').nth(2).map(str::trim) == Some("panic");
    if let (Some(rank), Some(at)) = (rank, at)
        && rank == comm.rank() as u64
        && at == update
    {
        if panics {
            // Deliberate: this is the fault being injected (a bug in the program).
            #[allow(clippy::panic)]
            {
                panic!(
                    "RAPTOR_MPI_FAULT: rank {rank} panics before update {update} (fault injection)"
                );
            }
        }
        eprintln!(
            "RAPTOR_MPI_FAULT: rank {rank} exits abruptly before update {update} (fault injection)"
        );
        std::process::exit(3);
    }
}

/// The rank the launcher gave this process, from its environment (before MPI is initialized:
/// used to keep non-zero ranks quiet). `None` when not launched by MPI.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

#[cfg(feature = "mpi")]
pub use self::mpi_impl::{Mpi, PANIC_EXIT_CODE};

#[cfg(feature = "mpi")]
mod mpi_impl {
    use super::{Collective, CommStats};
    use crate::Result;
    use mpi::collective::SystemOperation;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::{Communicator, CommunicatorCollectives, Root};
    use std::cell::Cell;

    /// The status `MPI_Abort` is given when a rank panics (Rust's own status for a panic).
    pub const PANIC_EXIT_CODE: i32 = 101;

    /// `MPI_COMM_WORLD` of an initialized MPI environment (Open MPI, MPICH, …): create it once
    /// per process with [`Mpi::init`] and keep it alive until the end (dropping it finalizes
    /// MPI).
    pub struct Mpi {
        world: SimpleCommunicator,
        // Declared after `world`: finalized last.
        _universe: mpi::environment::Universe,
        calls: Cell<u64>,
        bytes: Cell<u64>,
    }

    impl std::fmt::Debug for Mpi {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Mpi")
                .field("rank", &self.world.rank())
                .field("size", &self.world.size())
                .finish()
        }
    }

    impl Mpi {
        /// Initialize MPI (once per process). `None` if it was already initialized.
        ///
        /// With more than one rank this also installs a process-wide panic hook that, after the
        /// previous hook has printed the panic, calls `MPI_Abort` on `MPI_COMM_WORLD`: a rank
        /// that panics (on any thread) would otherwise unwind on its own while the other ranks
        /// wait forever in their next collective. Errors already end the job through
        /// [`Collective::abort`]; the hook covers panics, which should not happen but must not
        /// hang a cluster job.
        pub fn init() -> Option<Mpi> {
            let universe = mpi::initialize()?;
            let world = universe.world();
            if world.size() > 1 {
                let rank = world.rank();
                let previous = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    previous(info);
                    eprintln!("rank {rank} panicked: ending the whole MPI job (MPI_Abort)");
                    SimpleCommunicator::world().abort(PANIC_EXIT_CODE)
                }));
            }
            Some(Mpi {
                world,
                _universe: universe,
                calls: Cell::new(0),
                bytes: Cell::new(0),
            })
        }

        fn count(&self, bytes: usize) {
            self.calls.set(self.calls.get() + 1);
            self.bytes.set(self.bytes.get() + bytes as u64);
        }
    }

    impl Collective for Mpi {
        fn rank(&self) -> usize {
            self.world.rank() as usize
        }
        fn size(&self) -> usize {
            self.world.size() as usize
        }
        fn broadcast_u64(&self, buf: &mut Vec<u64>) -> Result<()> {
            let root = self.world.process_at_rank(0);
            let mut n = buf.len() as u64;
            root.broadcast_into(&mut n);
            buf.resize(n as usize, 0);
            root.broadcast_into(&mut buf[..]);
            self.count(8 * (buf.len() + 1));
            Ok(())
        }
        fn broadcast_f32(&self, buf: &mut [f32]) -> Result<()> {
            self.world.process_at_rank(0).broadcast_into(buf);
            self.count(4 * buf.len());
            Ok(())
        }
        fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
            let send = buf.to_vec();
            self.world
                .all_reduce_into(&send[..], buf, SystemOperation::sum());
            self.count(4 * buf.len());
            Ok(())
        }
        fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
            let send = buf.to_vec();
            self.world
                .all_reduce_into(&send[..], buf, SystemOperation::sum());
            self.count(8 * buf.len());
            Ok(())
        }
        fn stats(&self) -> CommStats {
            CommStats {
                calls: self.calls.get(),
                bytes: self.bytes.get(),
            }
        }
        fn abort(&self, code: i32) -> ! {
            self.world.abort(code)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn solo_is_the_identity() {
        let s = Solo;
        let mut v = vec![1u64, 2, 3];
        s.broadcast_u64(&mut v).unwrap();
        let mut f = vec![1.5f32];
        s.all_reduce_sum_f32(&mut f).unwrap();
        let mut g = vec![2.5f64, -1.0];
        s.all_reduce_sum_f64(&mut g).unwrap();
        let mut h = vec![0.25f32];
        s.broadcast_f32(&mut h).unwrap();
        assert_eq!(
            (v, f, g, h, s.rank(), s.size(), s.is_writer()),
            (
                vec![1, 2, 3],
                vec![1.5],
                vec![2.5, -1.0],
                vec![0.25],
                0,
                1,
                true
            )
        );
        assert_eq!(s.stats(), CommStats::default());
    }

    #[test]
    fn the_launcher_environment_is_read_not_guessed() {
        // Under `cargo test` no MPI launcher started this process (CI never runs the unit tests
        // under mpirun); each reader falls back to one process.
        if !launched_by_mpi() {
            assert_eq!(
                launcher_size(),
                std::env::var("SLURM_NTASKS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1)
            );
            assert_eq!(launcher_rank(), None);
        }
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
