#!/usr/bin/env bash
# 1,000 concurrent SSE streams (50 events, 20 ms apart, each) straight to the
# streaming origin, then through compaction-proxy: errors, event order, the
# gaps between events as the client sees them, and the proxy's RSS, open
# descriptors and threads at the peak. All on 127.0.0.1; see docs/load.md.
#
#   scripts/load/sse.sh
#   SSE_STREAMS=200 scripts/load/sse.sh
#
# Environment: SSE_STREAMS (default 1000), SSE_EVENTS (50), SSE_INTERVAL_MS
# (20), SSE_RAMP_SECS (seconds over which the connections open, default 1),
# and those of lib.sh.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SSE_STREAMS="${SSE_STREAMS:-1000}"
SSE_EVENTS="${SSE_EVENTS:-50}"
SSE_INTERVAL_MS="${SSE_INTERVAL_MS:-20}"
SSE_RAMP_SECS="${SSE_RAMP_SECS:-1}"

raise_fd_limit
ensure_tools
build_proxy
build_sse_bench
make_bodies

SSE_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
start_sse_origin "$SSE_PORT"
start_proxy "$PROXY_PORT" "http://127.0.0.1:$SSE_PORT"

run_streams() {
  local label="$1" url="$2" status=0
  log "$label: $SSE_STREAMS streams of $SSE_EVENTS events, ${SSE_INTERVAL_MS} ms apart"
  "$SSE_BENCH" client "$url" "$BODIES/sse.json" "$SSE_STREAMS" "$SSE_EVENTS" "$SSE_RAMP_SECS" \
    >"$LOAD_OUT/sse-$label.txt" 2>&1 || status=$?
  sed "s/^/$label: /" "$LOAD_OUT/sse-$label.txt"
  return "$status"
}

# Samples the proxy's figures every 0.2 s while the streams run; keeps the peak.
sample_peak() {
  local pid="$1" peak_rss=0 peak_fds=0 peak_threads=0 rss fds threads
  while kill -0 "$pid" 2>/dev/null && [[ ! -e "$RUN_DIR/sse-sampling-done" ]]; do
    rss="$(proc_rss_kb "$pid")" fds="$(proc_fds "$pid")" threads="$(proc_threads "$pid")"
    ((rss > peak_rss)) && peak_rss="$rss"
    ((fds > peak_fds)) && peak_fds="$fds"
    ((threads > peak_threads)) && peak_threads="$threads"
    echo "$peak_rss $peak_fds $peak_threads" >"$RUN_DIR/sse-peak"
    sleep 0.2
  done
}

failures=0
{
  echo "SSE: $SSE_STREAMS concurrent streams x $SSE_EVENTS events, ${SSE_INTERVAL_MS} ms apart, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
  run_streams origin "http://127.0.0.1:$SSE_PORT/v1/chat/completions" || failures=$((failures + 1))
  before="$(proc_rss_kb "$PROXY_PID") kB RSS, $(proc_fds "$PROXY_PID") fds, $(proc_threads "$PROXY_PID") threads"
  sample_peak "$PROXY_PID" &
  sampler="$!"
  STARTED_PIDS+=("$sampler")
  run_streams proxy "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" || failures=$((failures + 1))
  touch "$RUN_DIR/sse-sampling-done"
  wait "$sampler" || true
  read -r peak_rss peak_fds peak_threads <"$RUN_DIR/sse-peak"
  sleep 2
  echo "proxy before: $before; peak: $peak_rss kB RSS, $peak_fds fds, $peak_threads threads; 2 s after: $(proc_rss_kb "$PROXY_PID") kB RSS, $(proc_fds "$PROXY_PID") fds"
  echo "runs with failed or out-of-order streams: $failures"
  echo "$failures" >"$RUN_DIR/sse-failures"
} | tee "$LOAD_OUT/sse.md"
log "results in $LOAD_OUT"
[[ "$(cat "$RUN_DIR/sse-failures")" == 0 ]]
