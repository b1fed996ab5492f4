//! How this program's memory allocator gives freed memory back to the system.
//!
//! glibc's `malloc` serves a block of at least `M_MMAP_THRESHOLD` bytes with a mapping of its
//! own, unmapped when the block is freed; smaller blocks come from its arenas, which keep freed
//! space for reuse and return only what lies at their top. By default the threshold starts at
//! 128 KiB and rises to the size of every mapped block that is freed (up to 32 MiB), so once a
//! run has freed its first large tensor nearly every later tensor (the checkpoint as it is
//! loaded, activations, per-record gradients) is carved from an arena, and the arenas' free
//! space stays resident. Measured on `raptor train --data … --method raptor` (the backbone
//! upcycled to 8 experts; 2,000 news headlines, expected batch 250, micro-batches of 64): the
//! live heap stayed between 0.4 and 0.6 GiB while the arenas grew to 1.6 GiB, 1.2 GiB of it
//! free, and the process's peak resident memory reached 2.2 GiB.
//!
//! A fixed threshold of [`MMAP_THRESHOLD`] keeps every block of that size or more out of the
//! arenas (a fixed value also stops the rise), so the resident memory follows the live heap.
//! It changes where memory comes from, never a computed value. A threshold the user set
//! (`MALLOC_MMAP_THRESHOLD_`, or `glibc.malloc.mmap_threshold` in `GLIBC_TUNABLES`) is kept.
//! Other C libraries are left as they are.

/// Blocks of at least this many bytes are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: usize = 256 * 1024;

/// Whether the environment already sets glibc's mapping threshold.
fn user_set_threshold(get: impl Fn(&str) -> Option<String>) -> bool {
    get("MALLOC_MMAP_THRESHOLD_").is_some()
        || get("GLIBC_TUNABLES").is_some_and(|t| t.contains("glibc.malloc.mmap_threshold"))
}

/// Sets glibc's mapping threshold to [`MMAP_THRESHOLD`] unless the user set one. Call it first
/// thing in `main`, before any other thread starts. Returns whether it was set.
pub fn return_large_blocks() -> bool {
    if user_set_threshold(|k| std::env::var(k).ok()) {
        return false;
    }
    set_threshold(MMAP_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_threshold(bytes: usize) -> bool {
    let Ok(v) = libc::c_int::try_from(bytes) else {
        return false;
    };
    // SAFETY: `mallopt` only changes a parameter of glibc's allocator; it takes the allocator's
    // own lock and is sound to call at any time.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, v) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_threshold(_bytes: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A threshold the user set in either form is kept; anything else is not a setting.
    #[test]
    fn the_users_threshold_is_kept() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!user_set_threshold(env(&[])));
        assert!(user_set_threshold(env(&[(
            "MALLOC_MMAP_THRESHOLD_",
            "65536"
        )])));
        assert!(user_set_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=1048576"
        )])));
        assert!(!user_set_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2"
        )])));
    }

    /// On glibc, after a freed 16 MiB block has raised the default threshold past 4 MiB, the
    /// fixed threshold is accepted and a 4 MiB block is again served by a mapping of its own:
    /// allocating it raises the bytes glibc reports as mapped by its size and freeing it lowers
    /// them again (without the fixed threshold it would come from an arena). Other tests'
    /// threads allocate meanwhile, so one of a few tries must show it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_large_block_is_mapped_and_given_back() {
        drop(std::hint::black_box(vec![1u8; 16 << 20]));
        assert!(set_threshold(MMAP_THRESHOLD));
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
        let size = 16 * MMAP_THRESHOLD;
        let seen = (0..5).any(|_| {
            let before = mapped();
            let block = std::hint::black_box(vec![1u8; size]);
            let during = mapped();
            drop(block);
            let after = mapped();
            during >= before + size && after + size <= during
        });
        assert!(
            seen,
            "a {size}-byte block was never mapped and unmapped on its own"
        );
    }
}
