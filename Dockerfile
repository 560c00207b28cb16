# syntax=docker/dockerfile:1
#
# compaction-proxy container image.
#
#   docker build -t compaction-proxy:0.1.0 .
#   docker run --rm -p 8080:8080 compaction-proxy:0.1.0
#
# Health: the orchestrator probes `GET /healthz` (liveness) and `GET /readyz`
# (readiness) on the listen port; `GET /metrics` serves Prometheus metrics on
# the same port. There is deliberately no HEALTHCHECK: the slim runtime image
# has no curl/wget, and Kubernetes ignores HEALTHCHECK anyway.

############################
# Build stage
############################
FROM rust:1-bookworm AS builder
WORKDIR /src

# The whole (filtered, see .dockerignore) source tree: Cargo.toml's explicit
# [[bench]]/[[test]] targets must exist for cargo to load the manifest, and
# config/default.toml is embedded in the binary.
COPY . .

# BuildKit cache mounts keep the registry and target dir between builds; the
# binary is copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin compaction-proxy \
 && install -D -m 0755 target/release/compaction-proxy /out/compaction-proxy

############################
# Runtime stage
############################
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 compaction-proxy \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin compaction-proxy

COPY --from=builder /out/compaction-proxy /usr/local/bin/compaction-proxy
# Same file as the defaults embedded in the binary; mount your own over it
# (the Helm chart mounts its ConfigMap at /etc/compaction-proxy).
COPY config/default.toml /etc/compaction-proxy/config.toml

USER 10001:10001

# config/default.toml listens on 127.0.0.1; inside a container it must listen
# on all interfaces to be reachable. Env beats the config file.
ENV COMPACTION_PROXY_SERVER__LISTEN=0.0.0.0:8080
EXPOSE 8080

ENTRYPOINT ["/usr/local/bin/compaction-proxy"]
CMD ["serve", "--config", "/etc/compaction-proxy/config.toml"]
