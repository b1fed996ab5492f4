//! The process's memory: what is resident now, and giving the allocator's free pages back.
//!
//! glibc's allocator serves a block at least as large as its mmap threshold with a mapping of
//! its own and unmaps it when freed; smaller blocks are carved from its arenas, which give
//! back to the system only the free space at their top. The threshold starts at 128 KiB and
//! rises to the size of every mapped block that is freed (up to 32 MiB), so once the first
//! large tensor is freed nearly every tensor (activations, per-record gradients) comes from an
//! arena, and the arenas keep growing around the live heap: on an upcycled MiniLM with 8
//! experts per layer the live heap stayed below 0.6 GiB while the process held 2.2 GiB, most of
//! it free space inside the arenas. A program may replace the allocator (the `raptor` program
//! links jemalloc, which returns free pages on its own) and say how to release its free pages
//! with [`set_releaser`]; [`release_free_memory`] then calls that instead of glibc's trim.
//! Releasing changes no computed value; the next allocations fault their pages in again, so it
//! is done at a few points (before the start report's memory probe, after the preparation),
//! not after every update (measured: a trim after every update of the MoE run above cost
//! about a fifth more CPU time per update).

use std::sync::OnceLock;

/// How the program's allocator releases its free pages (see [`set_releaser`]).
static RELEASER: OnceLock<fn() -> bool> = OnceLock::new();

/// Registers how the process's allocator gives its free pages back (a program that replaces
/// the C library's allocator calls this once at start). Returns false when one was already
/// registered (the first stays).
pub fn set_releaser(release: fn() -> bool) -> bool {
    RELEASER.set(release).is_ok()
}

/// Resident bytes of this process (`VmRSS` of `/proc/self/status`; None where unreadable).
pub fn resident_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// Gives the free pages inside the allocator's arenas back to the system: the releaser
/// registered with [`set_releaser`], else glibc's `malloc_trim(0)` (which walks every arena,
/// the threads' included). Returns whether memory was released; false where the C library has
/// no such call (not glibc) or nothing was free.
pub fn release_free_memory() -> bool {
    if let Some(release) = RELEASER.get() {
        return release();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only returns free pages of glibc's own arenas to the kernel; it
        // takes each arena's lock, so it is safe beside other threads' allocations, and it
        // touches no memory a caller holds.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_small_blocks_are_given_back() {
        // Blocks below the mmap threshold, each followed by a small one that stays: freeing the
        // large ones leaves holes inside the arena that glibc's automatic trim (of an arena's
        // top only) cannot return; only the trim can.
        let mut large = Vec::new();
        let mut small = Vec::new();
        for i in 0..4096usize {
            large.push(vec![(i % 251) as u8 + 1; 64 * 1024]);
            small.push(vec![1u8; 512]);
        }
        let full = resident_bytes().unwrap();
        drop(large);
        let before = resident_bytes().unwrap();
        assert!(
            release_free_memory(),
            "256 MiB of free blocks: something to release"
        );
        let after = resident_bytes().unwrap();
        assert!(small.iter().all(|s| s.iter().all(|&b| b == 1)));
        // 256 MiB were freed in holes; at least half of it must leave the resident set.
        assert!(
            before.saturating_sub(after) > 128 << 20,
            "resident {full} with the blocks, {before} after freeing, {after} after the trim"
        );
    }

    #[test]
    fn resident_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(resident_bytes().unwrap() > 0);
        }
    }
}
