//! The shared store: [`LocalStore`] in front, Redis behind, so every
//! replica reuses the summary the first one wrote for the same prefix
//! (written with `SET NX`: the first writer wins, and every replica then
//! forwards the same bytes).
//!
//! Redis is never in a request's way for long: every command has a short
//! deadline (`[store] redis_timeout_ms`, 250 ms by default), and while Redis fails (down, slow, refusing) the store serves
//! from this process's memory alone, counts the failures
//! (`summary_store_errors_total`) and says so on `/readyz`. The connection
//! is made on first use and remade after a failure, at most once every
//! [`RECONNECT_AFTER`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::IntCounterVec;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Key, LocalStore, Store, StoreFuture, StoredSummary};

/// After a failure, how long before connecting is tried again.
pub const RECONNECT_AFTER: Duration = Duration::from_secs(2);
/// How long Redis keeps a summary.
pub const TTL_SECS: u64 = 7 * 24 * 3600;

pub struct RedisStore {
    local: LocalStore,
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<ConnectionManager>>,
    /// When connecting last failed.
    failed_at: Mutex<Option<Instant>>,
    /// Whether the last command failed.
    degraded: AtomicBool,
    errors: IntCounterVec,
    /// The deadline of one command (and of connecting).
    timeout: Duration,
}

impl RedisStore {
    /// A store over `url` (checked by the configuration already) in front
    /// of `local`; failures count in `errors` by operation; each command
    /// (and connecting) has `timeout`.
    pub fn new(
        url: &str,
        local: LocalStore,
        errors: IntCounterVec,
        timeout: Duration,
    ) -> redis::RedisResult<Self> {
        Ok(RedisStore {
            local,
            client: redis::Client::open(url)?,
            connection: tokio::sync::Mutex::new(None),
            failed_at: Mutex::new(None),
            degraded: AtomicBool::new(false),
            errors,
            timeout,
        })
    }

    fn redis_key(key: Key) -> String {
        format!("compaction-proxy:summary:{}", key.hex())
    }

    fn failed(&self, operation: &str, e: &dyn std::fmt::Display) {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "summary store: Redis failed; summaries are kept in this process only until it answers again");
        }
        self.errors.with_label_values(&[operation]).inc();
    }

    fn answered(&self) {
        if self.degraded.swap(false, Ordering::Relaxed) {
            tracing::info!("summary store: Redis answers again");
        }
    }

    /// The connection, made on first use; `None` while connecting fails
    /// (tried again after [`RECONNECT_AFTER`]).
    async fn connection(&self) -> Option<ConnectionManager> {
        let mut held = self.connection.lock().await;
        if let Some(connection) = held.as_ref() {
            return Some(connection.clone());
        }
        {
            let failed_at = self.failed_at.lock().unwrap_or_else(|e| e.into_inner());
            if failed_at.is_some_and(|at| at.elapsed() < RECONNECT_AFTER) {
                return None;
            }
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1)
            .set_max_delay(1000);
        let made = tokio::time::timeout(
            self.timeout * 2,
            self.client.get_connection_manager_with_config(config),
        )
        .await;
        match made {
            Ok(Ok(connection)) => {
                *held = Some(connection.clone());
                Some(connection)
            }
            Ok(Err(e)) => {
                self.connect_failed(&e);
                None
            }
            Err(_) => {
                self.connect_failed(&"connecting timed out");
                None
            }
        }
    }

    fn connect_failed(&self, e: &dyn std::fmt::Display) {
        *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.failed("connect", e);
    }

    /// Runs one command within the store's timeout; `None` on any failure.
    async fn run<T: redis::FromRedisValue>(
        &self,
        operation: &str,
        command: redis::Cmd,
    ) -> Option<T> {
        let mut connection = self.connection().await?;
        match tokio::time::timeout(self.timeout, command.query_async::<T>(&mut connection)).await {
            Ok(Ok(value)) => {
                self.answered();
                Some(value)
            }
            Ok(Err(e)) => {
                self.failed(operation, &e);
                None
            }
            Err(_) => {
                self.failed(operation, &"timed out");
                None
            }
        }
    }

    async fn get_shared(&self, key: Key) -> Option<StoredSummary> {
        if let Some(found) = self.local.get_local(key) {
            return Some(found);
        }
        let mut get = redis::cmd("GET");
        get.arg(Self::redis_key(key));
        let text: Option<String> = self.run("get", get).await?;
        let found: StoredSummary = serde_json::from_str(&text?).ok()?;
        Some(self.local.insert_if_absent(key, found))
    }

    async fn put_shared(&self, key: Key, value: StoredSummary) -> StoredSummary {
        let text = serde_json::to_string(&value).expect("summaries encode");
        let mut set = redis::cmd("SET");
        set.arg(Self::redis_key(key))
            .arg(text)
            .arg("NX")
            .arg("EX")
            .arg(TTL_SECS);
        let stored: Option<Option<String>> = self.run("put", set).await;
        if let Some(None) = stored {
            // Another replica wrote first: its summary is the one.
            let mut get = redis::cmd("GET");
            get.arg(Self::redis_key(key));
            let held: Option<Option<String>> = self.run("get", get).await;
            if let Some(first) = held
                .flatten()
                .and_then(|t| serde_json::from_str::<StoredSummary>(&t).ok())
            {
                return self.local.insert_if_absent(key, first);
            }
        }
        self.local.insert_if_absent(key, value)
    }
}

impl Store for RedisStore {
    fn get(&self, key: Key) -> StoreFuture<'_, Option<StoredSummary>> {
        Box::pin(self.get_shared(key))
    }

    fn put_if_absent(&self, key: Key, value: StoredSummary) -> StoreFuture<'_, StoredSummary> {
        Box::pin(self.put_shared(key, value))
    }

    fn get_local(&self, key: Key) -> Option<StoredSummary> {
        self.local.get_local(key)
    }

    fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }
}
