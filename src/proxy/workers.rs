//! Where connections are served: one single-threaded tokio runtime per
//! core, each on its own thread, the way nginx runs one worker process per
//! core. A connection lives on one worker for its whole life, and so do its
//! requests and the upstream connections they open (each worker has its own
//! upstream client, [`super::upstream::Upstream`]), so a request never
//! wakes another thread. On a multi-threaded runtime every request crossed
//! threads between the client connection's task and the pooled upstream
//! connection's task, and those wake-ups cost more than the proxying: a
//! plain hyper proxy served twice the requests per second on per-core
//! runtimes (`docs/load.md`).
//!
//! The accept loop ([`super::server::serve`]) hands each new connection to
//! the next worker in turn. Large compactions still leave the worker for
//! the blocking pool ([`super::compact`]), so one cannot stall the other
//! connections of its worker.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The index of the worker this thread runs, if it runs one.
    static WORKER_INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the worker running the calling thread; 0 elsewhere (tests
/// and tools that serve on their own runtime).
pub fn current_index() -> usize {
    WORKER_INDEX.with(Cell::get).unwrap_or(0)
}

/// Where the accept loop puts each connection's task.
pub enum Workers {
    /// On the runtime that runs the accept loop (tests, embedding).
    Current,
    /// On per-core worker runtimes, in turn.
    Pool(Pool),
}

impl Workers {
    /// Runs the future `make` gives on the next worker. `make` is called on
    /// that worker's thread, so what it registers (a socket) belongs to
    /// that worker's runtime.
    pub fn spawn<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        match self {
            Workers::Current => {
                tokio::spawn(async move { make().await });
            }
            Workers::Pool(pool) => {
                let turn = pool.next.fetch_add(1, Ordering::Relaxed) % pool.handles.len();
                pool.handles[turn].spawn(async move { make().await });
            }
        }
    }
}

impl Workers {
    /// The runtimes connections are served on (called on a runtime).
    pub fn runtimes(&self) -> Vec<Handle> {
        match self {
            Workers::Current => vec![Handle::current()],
            Workers::Pool(pool) => pool.handles.clone(),
        }
    }
}

/// Worker threads, each running a single-threaded runtime until the pool
/// is dropped.
pub struct Pool {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    /// Starts `count` workers (at least one).
    pub fn start(count: usize) -> std::io::Result<Pool> {
        let mut pool = Pool {
            handles: Vec::new(),
            next: AtomicUsize::new(0),
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            pool.handles.push(runtime.handle().clone());
            pool.stops.push(stop);
            let thread = std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || {
                    WORKER_INDEX.with(|w| w.set(Some(index)));
                    crate::log_buffer::buffer_this_thread();
                    runtime.block_on(async {
                        let flushing = tokio::spawn(async {
                            let mut every = tokio::time::interval(crate::log_buffer::FLUSH_EVERY);
                            loop {
                                every.tick().await;
                                crate::log_buffer::flush_this_thread();
                            }
                        });
                        let _ = stopped.await;
                        flushing.abort();
                    });
                    // Dropping the runtime cancels the tasks still on it:
                    // the accept loop has already drained what it could.
                    drop(runtime);
                    crate::log_buffer::flush_this_thread();
                })?;
            pool.threads.push(thread);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The number of workers for `server.workers` (0: one per core).
pub fn count_for(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn connections_go_to_each_worker_in_turn_and_run_there() {
        let pool = Pool::start(3).unwrap();
        let workers = Workers::Pool(pool);
        let (tx, rx) = mpsc::channel();
        for _ in 0..6 {
            let tx = tx.clone();
            workers.spawn(move || async move {
                tx.send(current_index()).unwrap();
            });
        }
        let mut seen: Vec<usize> = (0..6).map(|_| rx.recv().unwrap()).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn dropping_the_pool_stops_its_threads() {
        let pool = Pool::start(2).unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        // A task still pending when the pool goes is dropped, not leaked:
        // its sender closes and the receiver sees it.
        let workers = Workers::Pool(pool);
        workers.spawn(move || async move {
            let _held = tx;
            std::future::pending::<()>().await;
        });
        drop(workers);
        assert!(rx.recv().is_err());
    }
}
