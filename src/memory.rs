//! Giving freed memory back to the system. glibc's allocator keeps what a
//! burst of large bodies freed inside its arenas (one per thread that
//! allocated, blocking-pool threads included), so after a soak of 200 KB
//! compactions the process stayed ~20% above its warm size for good.
//! `malloc_trim(0)` hands the free pages back; it is cheap next to the
//! interval (it walks the arenas' free lists) and runs off the workers.

use std::time::Duration;

/// How often freed memory is handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Hands freed memory back every [`TRIM_EVERY`], forever.
pub async fn return_freed_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let _ = tokio::task::spawn_blocking(return_freed).await;
    }
}

/// Hands the allocator's free pages back to the system, where the
/// allocator can (glibc); elsewhere a no-op.
pub fn return_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only reads and updates the allocator's own state,
    // under the allocator's locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn returning_freed_memory_leaves_live_allocations_intact() {
        let kept: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 300_000]).collect();
        drop((0..64).map(|_| vec![0u8; 300_000]).collect::<Vec<_>>());
        super::return_freed();
        for (i, v) in kept.iter().enumerate() {
            assert!(v.iter().all(|&b| b == i as u8));
        }
    }
}
