//! The state all requests share: the configuration in force (swapped whole
//! on reload), the upstream client, caches, metrics and the bounds on
//! concurrent work. The admin endpoints get only the handles they use
//! ([`AppState::admin_handles`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::upstream::Upstream;
use super::{admin, body};
use crate::cache::{CheckpointStore, CompactionCache, PrefixCache};
use crate::metrics::Metrics;
use crate::policy::Runtime;

/// Bytes of original-request prints the bill's estimate remembers (16
/// bytes per KB of body: this holds the last turn of about 2,000
/// conversations of 500 KB).
pub const PRINT_MEMORY_BYTES: u64 = 16 * 1024 * 1024;

/// State shared by all requests. The runtime (config and policies) is
/// swapped whole on reload; each request holds the one it started with.
pub struct AppState {
    runtime: RwLock<Arc<Runtime>>,
    pub metrics: Metrics,
    pub cache: CompactionCache,
    /// Live per-message reports asked for with `x-compaction-report`.
    pub reports: crate::explain::ReportStore,
    /// Stable mode's replay checkpoints.
    pub checkpoints: CheckpointStore,
    /// Parses of recent large bodies, for the next turn to resume from.
    pub prefixes: PrefixCache,
    /// The inspector's recent requests (kept while `[inspector]` is on).
    pub inspector: crate::inspector::RecentRequests,
    /// Prints of recent original requests, for the bill's estimate.
    pub prints: crate::usage::PrefixMemory,
    /// Bills of requests whose report is kept, by report id (the inspector's).
    pub bills: crate::usage::BillStore,
    /// What recall did for requests whose report is kept, by report id.
    pub recalled: crate::explain::RecalledStore,
    pub(super) upstream: Upstream,
    /// One permit per core: compactions beyond that queue (see [`super::compact`]);
    /// `/v1/memory-compact` takes the same permits.
    pub(crate) compactions: Arc<tokio::sync::Semaphore>,
    /// Summaries by what they were made from ([`crate::store`]).
    pub summary_store: Arc<dyn crate::store::Store>,
    /// The connection pool of summarizer calls.
    pub summarizer_client: crate::summarizer::client::HttpClient,
    /// Keys of summaries being written in the background.
    pub(crate) summaries_in_flight: std::sync::Mutex<std::collections::HashSet<u128>>,
    /// Stable mode, background timing: the summary each re-compaction
    /// chose, by the key of what it replaced.
    pub(crate) summary_choices: moka::sync::Cache<u128, u128>,
    /// Request bytes held in memory across all requests.
    pub buffers: Arc<body::BufferBudget>,
    shutting_down: AtomicBool,
    /// Upgraded connections (WebSocket) still open: hyper's graceful
    /// shutdown no longer sees them, so the drain waits for them here.
    open_tunnels: AtomicUsize,
    tunnel_closed: tokio::sync::Notify,
    /// Whether an unmatched POST to a well-known API path was noted in the
    /// log yet, by the format its path names ([`crate::format::Format::ALL`]).
    pub(super) unmatched_noted: [AtomicBool; 3],
}

impl AppState {
    pub fn new(runtime: Runtime) -> Arc<Self> {
        let upstream = Upstream::new(
            &runtime.upstream,
            runtime.timeouts.connect,
            // Past the request's own deadline, so its client gets the 504
            // first; the stalled socket is closed afterwards.
            runtime.timeouts.response_header * 2,
            &runtime.upstream_roots,
            super::workers::count_for(runtime.config.server.workers),
        );
        let store_bytes = match runtime.config.store.max_bytes {
            0 => 16 * 1024 * 1024,
            n => n,
        };
        let metrics = Metrics::new();
        let local = crate::store::LocalStore::new(store_bytes);
        let summary_store: Arc<dyn crate::store::Store> = match &runtime.config.store.redis_url {
            // The URL was checked with the configuration.
            Some(url) => match crate::store::redis::RedisStore::new(
                url,
                crate::store::LocalStore::new(store_bytes),
                metrics.summary_store_errors(),
                std::time::Duration::from_millis(runtime.config.store.redis_timeout_ms.max(1)),
            ) {
                Ok(shared) => Arc::new(shared),
                Err(_) => Arc::new(local),
            },
            None => Arc::new(local),
        };
        Arc::new(AppState {
            summary_store,
            summarizer_client: crate::summarizer::client::HttpClient::new(),
            summaries_in_flight: Default::default(),
            summary_choices: moka::sync::Cache::new(100_000),
            cache: CompactionCache::new(runtime.config.cache.max_bytes),
            checkpoints: CheckpointStore::new(runtime.config.cache.checkpoint_max_bytes),
            prefixes: PrefixCache::new(runtime.config.cache.prefix_max_bytes),
            inspector: crate::inspector::RecentRequests::new(
                runtime.config.inspector.max_requests,
                runtime.config.inspector.max_bytes,
            ),
            prints: crate::usage::PrefixMemory::new(PRINT_MEMORY_BYTES),
            bills: crate::usage::BillStore::default(),
            recalled: crate::explain::RecalledStore::default(),
            runtime: RwLock::new(Arc::new(runtime)),
            metrics,
            reports: crate::explain::ReportStore::default(),
            upstream,
            compactions: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            buffers: body::BufferBudget::new(),
            shutting_down: AtomicBool::new(false),
            open_tunnels: AtomicUsize::new(0),
            tunnel_closed: tokio::sync::Notify::new(),
            unmatched_noted: Default::default(),
        })
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts a new configuration in force for the requests that start after.
    pub fn reload(&self, runtime: Runtime) {
        *self.runtime.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(runtime);
        self.cache.clear();
        self.checkpoints.clear();
        self.prefixes.clear();
    }

    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::Relaxed)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// What the admin endpoints use, and nothing else.
    pub fn admin_handles(&self) -> admin::Handles<'_> {
        let runtime = self.runtime();
        admin::Handles {
            ready: self.is_ready(),
            store_degraded: self.summary_store.degraded(),
            metrics: &self.metrics,
            reports: &self.reports,
            bills: &self.bills,
            recalled: &self.recalled,
            compactions: &self.compactions,
            buffers: &self.buffers,
            limits: body::limits(&runtime),
            inspector: crate::inspector::Handles {
                settings: runtime.inspector.clone(),
                requests: &self.inspector,
            },
            prefixes: &self.prefixes,
        }
    }

    /// Resolves once no upgraded connection is open.
    pub async fn tunnels_closed(&self) {
        loop {
            let closed = self.tunnel_closed.notified();
            if self.open_tunnels.load(Ordering::Acquire) == 0 {
                return;
            }
            closed.await;
        }
    }
}

/// Counts one open tunnel for as long as it lives.
pub(super) struct TunnelGuard(Arc<AppState>);

impl TunnelGuard {
    pub(super) fn open(state: &Arc<AppState>) -> Self {
        state.open_tunnels.fetch_add(1, Ordering::AcqRel);
        TunnelGuard(state.clone())
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.0.open_tunnels.fetch_sub(1, Ordering::AcqRel);
        self.0.tunnel_closed.notify_waiters();
    }
}
