//! Policy resolution: the compiled configuration a request runs under
//! ([`Runtime`]), and the policy for a request from its route and tenant.
//! Turning a loaded [`Config`] into it, with every check serde cannot make,
//! is [`compile`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Uri};
use rustls_pki_types::CertificateDer;

use crate::analysis_store::AnalysisStore;
use crate::config::{self, Config};
use crate::format::Format;

pub use crate::compaction::policy::{CompiledPolicy, MAX_GOAL_CHARS};

mod compile;
use compile::compile_policy;
pub use compile::parse_listen;

/// More worker threads than this would be a typo, not a machine.
pub const MAX_WORKERS: usize = 1024;

/// Label used for tenants that are not configured (bounded metric labels).
pub const OTHER_TENANT: &str = "other";

/// [`OTHER_TENANT`] as a shared label: every request's copy is a reference
/// count, not an allocation.
pub fn other_tenant() -> Arc<str> {
    static OTHER: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| OTHER_TENANT.into());
    OTHER.clone()
}

/// Every configured duration, typed once when the configuration is
/// compiled (the TOML keys are seconds, `*_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub shutdown_delay: Duration,
    pub shutdown_grace: Duration,
    pub connect: Duration,
    pub response_header: Duration,
    pub upstream_idle: Duration,
    pub header_read: Duration,
    pub body_idle: Duration,
    pub keep_alive: Duration,
}

/// A policy's summaries: its summarizer, timing and prompt.
#[derive(Debug, Clone)]
pub struct SummaryPolicy {
    pub summarizer: Arc<crate::summarizer::Settings>,
    pub timing: config::SummaryTiming,
    pub role: config::SummaryRole,
    pub prompt: crate::summarizer::prompt::PromptSettings,
}

/// The model calls a policy makes besides compacting; the proxy makes
/// them ([`crate::proxy`]), the pure pipeline never sees them.
#[derive(Debug, Default)]
pub struct ModelCalls {
    /// `strategy = "summarize"`: how this policy's summaries are written.
    pub summary: Option<Arc<SummaryPolicy>>,
    /// `tool_decisions = "model"`: the model that judges old tool calls.
    pub decisions: Option<Arc<crate::summarizer::Settings>>,
}

/// One configured policy, as routes and tenants hold it.
#[derive(Debug, Clone)]
struct Configured {
    policy: Arc<CompiledPolicy>,
    models: Arc<ModelCalls>,
}

#[derive(Debug)]
struct Route {
    /// The configured path: the route's metric label.
    label: Arc<str>,
    /// The path's segments after the leading `/`; `*` matches any one.
    segments: Vec<String>,
    /// The path ended in `*`: its last segment is a prefix of the rest of
    /// the request path, however deep.
    prefix: bool,
    format: Format,
    policy: Configured,
}

impl Route {
    fn new(path: &str, format: Format, policy: Configured) -> Self {
        let (pattern, prefix) = match path.strip_suffix('*') {
            Some(p) => (p, true),
            None => (path, false),
        };
        Route {
            label: path.into(),
            segments: pattern
                .strip_prefix('/')
                .unwrap_or(pattern)
                .split('/')
                .map(str::to_owned)
                .collect(),
            prefix,
            format,
            policy,
        }
    }

    fn matches(&self, path: &str) -> bool {
        let mut rest = path;
        for (i, want) in self.segments.iter().enumerate() {
            let Some(r) = rest.strip_prefix('/') else {
                return false;
            };
            if self.prefix && i + 1 == self.segments.len() {
                return r.starts_with(want.as_str());
            }
            let (segment, tail) = r.split_at(r.find('/').unwrap_or(r.len()));
            if want != "*" && want != segment {
                return false;
            }
            rest = tail;
        }
        rest.is_empty()
    }
}

/// Everything the proxy needs from one configuration, checked and compiled.
/// Swapped whole on reload; a request keeps the one it started with.
#[derive(Debug)]
pub struct Runtime {
    pub config: Config,
    pub listen: SocketAddr,
    pub upstream: Uri,
    /// Extra CA certificates for the upstream (`upstream.ca_file`).
    pub upstream_roots: Vec<CertificateDer<'static>>,
    pub timeouts: Timeouts,
    routes: Vec<Route>,
    /// The `[summarizers.<name>]` sections, compiled.
    summarizers: HashMap<String, Arc<crate::summarizer::Settings>>,
    tenant_header: HeaderName,
    tenants: HashMap<Arc<str>, Configured>,
    /// `[inspector]`, its token read.
    pub inspector: crate::inspector::Settings,
    /// `[prices]`, compiled: costs and the model-family label of billing.
    pub prices: Arc<crate::usage::Prices>,
}

/// What applies to one request on a matched route.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The route's configured path: a bounded metric label.
    pub route: Arc<str>,
    pub policy: Arc<CompiledPolicy>,
    /// The model calls the policy makes besides compacting.
    pub models: Arc<ModelCalls>,
    /// The tenant if configured, else [`OTHER_TENANT`].
    pub tenant: Arc<str>,
    /// The route's body format.
    pub format: Format,
}

impl Runtime {
    /// The summarizer named `name`, if a section defines it.
    pub fn summarizer(&self, name: &str) -> Option<Arc<crate::summarizer::Settings>> {
        self.summarizers.get(name).cloned()
    }

    /// The policy for a request: the first matching route's, overridden by a
    /// configured tenant's. `None` when no route matches (pass through).
    pub fn resolve(&self, path: &str, headers: &HeaderMap) -> Option<Resolution> {
        let route = self.routes.iter().find(|r| r.matches(path))?;
        let tenant = headers
            .get(&self.tenant_header)
            .and_then(|v| v.to_str().ok())
            .and_then(|t| self.tenants.get_key_value(t));
        let (tenant, configured) = match tenant {
            Some((name, configured)) => (name.clone(), configured),
            None => (other_tenant(), &route.policy),
        };
        Some(Resolution {
            route: self.route_label(route),
            policy: configured.policy.clone(),
            models: configured.models.clone(),
            tenant,
            format: route.format,
        })
    }

    /// The tenant header, when it is the proxy's alone (`None` with
    /// `tenants.forward_header = true`: it goes upstream too).
    pub fn own_tenant_header(&self) -> Option<&HeaderName> {
        (!self.config.tenants.forward_header).then_some(&self.tenant_header)
    }

    fn route_label(&self, route: &Route) -> Arc<str> {
        route.label.clone()
    }

    /// A named policy, for the offline `compact` command.
    pub fn policy(&self, name: &str) -> Option<Arc<CompiledPolicy>> {
        self.routes
            .iter()
            .map(|r| &r.policy)
            .chain(self.tenants.values())
            .map(|c| &c.policy)
            .find(|p| &*p.name == name)
            .cloned()
            .or_else(|| {
                // One offline compaction: nothing to share analyses with.
                let analyses = Arc::new(AnalysisStore::new(0));
                compile_policy(name, self.config.policies.get(name)?, &analyses)
                    .ok()
                    .map(Arc::new)
            })
    }
}

#[cfg(test)]
mod tests;
