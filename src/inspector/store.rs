//! The inspector's recent requests: newest last in memory, newest first
//! when listed, bounded by a count and by bytes (the oldest go first past
//! either). An entry is made when the request is decided, with what the
//! loss report says; its side-by-side view, its HTTP status, and the billed
//! usage and saving (once the response is read) are added as they become
//! known, each by the request's id.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::view::Detail;
use crate::outcome::LossSummary;

/// The provider's own billed figures for one request, from its answer's
/// `usage`. Each figure is `None` when the answer did not say (unknown is
/// never zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BilledUsage {
    /// Input tokens billed at the full price (not read from a prompt cache).
    pub uncached_input_tokens: Option<u64>,
    /// Input tokens served from the provider's prompt cache.
    pub cache_read_input_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write_input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The bill in the configured currency unit, when a price is configured.
    pub cost: Option<f64>,
}

/// What the proxy estimates the request saved against sending the original;
/// negative when compaction raised the bill (lost prompt-cache hits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EstimatedSaving {
    /// Input tokens the original would have been billed, as the bill counts.
    pub input_tokens: Option<i64>,
    /// In the configured currency unit, when a price is configured.
    pub cost: Option<f64>,
}

/// One request's line of the list.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: String,
    /// When the request arrived, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    #[serde(serialize_with = "as_str")]
    pub route: Arc<str>,
    pub format: &'static str,
    #[serde(serialize_with = "as_str")]
    pub tenant: Arc<str>,
    #[serde(serialize_with = "as_str")]
    pub policy: Arc<str>,
    /// As `x-compaction-status` says.
    pub status: String,
    /// The status's bounded label (`compacted`, `unchanged`, `skipped`,
    /// `bypassed`, `dry-run`): what the status filter matches.
    pub status_label: &'static str,
    /// The answer's HTTP status, once it went out.
    pub http_status: Option<u16>,
    pub loss: Option<LossSummary>,
    /// Billed usage, once the response's usage was read.
    pub usage: Option<BilledUsage>,
    /// The estimated saving, once known.
    pub estimated_saving: Option<EstimatedSaving>,
    /// The side-by-side view is still being computed.
    pub pending: bool,
    /// What recall did (`recall = true` with markers forwarded), once the
    /// answer went out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall: Option<crate::compaction::recall::Recalled>,
}

fn as_str<S: serde::Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

struct Entry {
    summary: Summary,
    detail: Option<Arc<Detail>>,
    /// What this entry holds, as counted against the byte bound.
    bytes: usize,
}

impl Entry {
    fn weigh(&mut self) {
        self.bytes = std::mem::size_of::<Entry>()
            + self.summary.id.len()
            + self.summary.status.len()
            + self.detail.as_ref().map_or(0, |d| d.bytes());
    }
}

/// Which requests a list shows; an unset filter matches all.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub tenant: Option<String>,
    pub policy: Option<String>,
    /// A status label (`compacted`) or a whole status (`skipped; not-json`).
    pub status: Option<String>,
}

impl Filter {
    fn matches(&self, s: &Summary) -> bool {
        self.tenant.as_deref().map_or(true, |t| *s.tenant == *t)
            && self.policy.as_deref().map_or(true, |p| *s.policy == *p)
            && self
                .status
                .as_deref()
                .map_or(true, |st| s.status_label == st || s.status == st)
    }
}

/// The bounded store of recent requests.
pub struct RecentRequests {
    max_requests: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Oldest first.
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl Inner {
    fn find(&mut self, id: &str) -> Option<&mut Entry> {
        // Updates come for recent requests: search from the newest.
        self.entries.iter_mut().rev().find(|e| e.summary.id == id)
    }
}

impl RecentRequests {
    pub fn new(max_requests: usize, max_bytes: u64) -> Self {
        RecentRequests {
            max_requests,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a request as decided; its view follows with [`Self::set_detail`].
    pub fn insert(&self, summary: Summary) {
        if self.max_requests == 0 {
            return;
        }
        let mut entry = Entry {
            summary,
            detail: None,
            bytes: 0,
        };
        entry.weigh();
        let mut inner = self.lock();
        inner.bytes += entry.bytes;
        inner.entries.push_back(entry);
        self.evict(&mut inner);
    }

    /// Adds a request's side-by-side view. A view larger than the whole
    /// byte bound is not kept: the line stays, without it.
    pub fn set_detail(&self, id: &str, detail: Detail) {
        let max_bytes = self.max_bytes;
        self.update(id, |entry| {
            entry.summary.pending = false;
            if detail.bytes() > max_bytes / 2 {
                entry.detail = Some(Arc::new(Detail::unavailable(
                    "larger than the inspector keeps (inspector.max_bytes)",
                )));
                return;
            }
            let mut detail = detail;
            // What recall did may be known before the view is made.
            if let Some(done) = &entry.summary.recall {
                detail.mark_recalled(&done.recalled_ids);
            }
            entry.detail = Some(Arc::new(detail));
        });
    }

    /// What recall did for the request: its line says it, and its view
    /// marks the recalled messages.
    pub fn set_recall(&self, id: &str, done: crate::compaction::recall::Recalled) {
        self.update(id, |entry| {
            if let Some(detail) = &mut entry.detail {
                Arc::make_mut(detail).mark_recalled(&done.recalled_ids);
            }
            entry.summary.recall = Some(done);
        });
    }

    /// The answer's HTTP status, when it went out.
    pub fn set_http_status(&self, id: &str, status: u16) {
        self.update(id, |entry| entry.summary.http_status = Some(status));
    }

    /// The billed usage read from the request's answer.
    pub fn set_usage(&self, id: &str, usage: BilledUsage) {
        self.update(id, |entry| entry.summary.usage = Some(usage));
    }

    /// The request's estimated saving.
    pub fn set_saving(&self, id: &str, saving: EstimatedSaving) {
        self.update(id, |entry| entry.summary.estimated_saving = Some(saving));
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Entry)) {
        let mut inner = self.lock();
        let Some(entry) = inner.find(id) else {
            return; // evicted already
        };
        let before = entry.bytes;
        change(entry);
        entry.weigh();
        let after = entry.bytes;
        inner.bytes = inner.bytes - before + after;
        self.evict(&mut inner);
    }

    fn evict(&self, inner: &mut Inner) {
        while inner.entries.len() > self.max_requests
            || (inner.bytes > self.max_bytes && inner.entries.len() > 1)
        {
            let Some(oldest) = inner.entries.pop_front() else {
                break;
            };
            inner.bytes -= oldest.bytes;
        }
    }

    /// The lines matching `filter`, newest first, at most `limit`.
    pub fn list(&self, filter: &Filter, limit: usize) -> Vec<Summary> {
        let inner = self.lock();
        inner
            .entries
            .iter()
            .rev()
            .filter(|e| filter.matches(&e.summary))
            .take(limit)
            .map(|e| e.summary.clone())
            .collect()
    }

    /// One request's line and view (`None` while pending).
    pub fn get(&self, id: &str) -> Option<(Summary, Option<Arc<Detail>>)> {
        let mut inner = self.lock();
        inner
            .find(id)
            .map(|e| (e.summary.clone(), e.detail.clone()))
    }

    /// The tenants and policies of the kept requests, sorted, each once:
    /// what the page's filters offer.
    pub fn facets(&self) -> (Vec<Arc<str>>, Vec<Arc<str>>) {
        let inner = self.lock();
        let mut tenants: Vec<Arc<str>> = inner
            .entries
            .iter()
            .map(|e| e.summary.tenant.clone())
            .collect();
        let mut policies: Vec<Arc<str>> = inner
            .entries
            .iter()
            .map(|e| e.summary.policy.clone())
            .collect();
        for list in [&mut tenants, &mut policies] {
            list.sort();
            list.dedup();
        }
        (tenants, policies)
    }

    /// Requests kept and the bytes they hold.
    pub fn size(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(id: &str, tenant: &str, status: &'static str) -> Summary {
        Summary {
            id: id.into(),
            time_ms: 0,
            route: "/v1/chat/completions".into(),
            format: "chat",
            tenant: tenant.into(),
            policy: "default".into(),
            status: status.into(),
            status_label: status,
            http_status: None,
            loss: None,
            usage: None,
            estimated_saving: None,
            pending: true,
            recall: None,
        }
    }

    fn ids(list: &[Summary]) -> Vec<&str> {
        list.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn lists_newest_first_and_keeps_at_most_max_requests() {
        let store = RecentRequests::new(3, 1 << 20);
        for id in ["a", "b", "c", "d"] {
            store.insert(summary(id, "t", "compacted"));
        }
        assert_eq!(ids(&store.list(&Filter::default(), 10)), ["d", "c", "b"]);
        assert_eq!(ids(&store.list(&Filter::default(), 2)), ["d", "c"]);
        assert!(store.get("a").is_none(), "the oldest went first");
    }

    #[test]
    fn filters_by_tenant_policy_and_status() {
        let store = RecentRequests::new(10, 1 << 20);
        store.insert(summary("a", "acme", "compacted"));
        store.insert(summary("b", "other", "unchanged"));
        store.insert(summary("c", "acme", "unchanged"));
        let by = |tenant: Option<&str>, status: Option<&str>| {
            let filter = Filter {
                tenant: tenant.map(Into::into),
                policy: Some("default".into()),
                status: status.map(Into::into),
            };
            ids(&store.list(&filter, 10))
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(by(Some("acme"), None), ["c", "a"]);
        assert_eq!(by(Some("acme"), Some("unchanged")), ["c"]);
        assert_eq!(by(None, Some("compacted")), ["a"]);
        let none = Filter {
            policy: Some("strict".into()),
            ..Filter::default()
        };
        assert!(store.list(&none, 10).is_empty());
    }

    #[test]
    fn holds_a_bounded_number_of_bytes_evicting_the_oldest() {
        let store = RecentRequests::new(1000, 64 * 1024);
        for i in 0..50 {
            let id = format!("r{i}");
            store.insert(summary(&id, "t", "compacted"));
            store.set_detail(&id, Detail::for_test(&"x".repeat(10_000)));
        }
        let (count, bytes) = store.size();
        assert!(bytes <= 64 * 1024, "{bytes}");
        assert!(count < 50 && count > 1, "{count}");
        assert!(store.get("r49").unwrap().1.is_some(), "the newest is whole");
        assert!(store.get("r0").is_none());
    }

    #[test]
    fn a_view_larger_than_the_bound_is_not_kept_but_its_line_is() {
        let store = RecentRequests::new(10, 4096);
        store.insert(summary("big", "t", "compacted"));
        store.set_detail("big", Detail::for_test(&"x".repeat(10_000)));
        let (line, detail) = store.get("big").unwrap();
        assert!(!line.pending);
        let detail = detail.unwrap();
        assert!(detail.rows.is_empty());
        assert!(detail.unavailable.is_some());
    }

    #[test]
    fn usage_saving_and_status_arrive_by_id() {
        let store = RecentRequests::new(10, 1 << 20);
        store.insert(summary("a", "t", "compacted"));
        let usage = BilledUsage {
            uncached_input_tokens: Some(120),
            cache_read_input_tokens: Some(900),
            cache_write_input_tokens: None,
            output_tokens: Some(40),
            cost: None,
        };
        store.set_usage("a", usage);
        store.set_saving(
            "a",
            EstimatedSaving {
                input_tokens: Some(-30),
                cost: None,
            },
        );
        store.set_http_status("a", 200);
        store.set_usage("gone", usage); // an evicted id is ignored
        let (line, _) = store.get("a").unwrap();
        assert_eq!(line.usage, Some(usage));
        assert_eq!(line.estimated_saving.unwrap().input_tokens, Some(-30));
        assert_eq!(line.http_status, Some(200));
    }
}
