#!/usr/bin/env bash
# Soak: mixed traffic through compaction-proxy for SOAK_SECS (default 600),
# then IDLE_SECS (default 60) of nothing, reporting the proxy's RSS, open
# descriptors, threads and tokio tasks (its `compaction_proxy_tasks` metric)
# at each step. The mix, all at once, closed loop:
#   - 1 KB bodies within budget (wrk, SOAK_SMALL_CONNS connections, default 8)
#   - 200 KB bodies, every one different, compacted cold (wrk, SOAK_LARGE_CONNS, 2)
#   - invalid JSON declared as JSON, forwarded untouched (wrk, SOAK_INVALID_CONNS, 2)
#   - SSE streams of 50 events 20 ms apart, one after another on each of
#     SOAK_SSE_STREAMS connections (default 50)
# The origin is nginx (a fixed completion), which hands requests marked
# `x-load-sse: 1` to the streaming origin. All on 127.0.0.1; see docs/load.md.
#
#   scripts/load/soak.sh                      # 10 minutes + 1 minute idle
#   SOAK_SECS=60 IDLE_SECS=20 scripts/load/soak.sh
#
# Environment: SOAK_SECS, WARMUP_SECS (same mix before the soak, default 120:
# in a 10-minute run RSS reached its plateau about 90 s in),
# IDLE_SECS, the connection counts above, and those of lib.sh.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SOAK_SECS="${SOAK_SECS:-600}"
WARMUP_SECS="${WARMUP_SECS:-120}"
IDLE_SECS="${IDLE_SECS:-60}"
SOAK_SMALL_CONNS="${SOAK_SMALL_CONNS:-8}"
SOAK_LARGE_CONNS="${SOAK_LARGE_CONNS:-2}"
SOAK_INVALID_CONNS="${SOAK_INVALID_CONNS:-2}"
SOAK_SSE_STREAMS="${SOAK_SSE_STREAMS:-50}"

raise_fd_limit
ensure_tools
build_proxy
build_sse_bench
make_bodies

SSE_PORT="$(free_port)"
ORIGIN_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
start_sse_origin "$SSE_PORT"
start_origin "$ORIGIN_PORT" "$SSE_PORT"
start_proxy "$PROXY_PORT" "http://127.0.0.1:$ORIGIN_PORT"
URL="http://127.0.0.1:$PROXY_PORT/v1/chat/completions"

# Tasks as the proxy's /metrics reports them (the scrape's own connection
# included); "-" from a binary without the metric.
proxy_tasks() {
  curl -sf "http://127.0.0.1:$PROXY_PORT/metrics" |
    awk '$1 == "compaction_proxy_tasks" { n = $2 } END { print (n == "" ? "-" : n) }'
}
figures() { echo "$(proc_rss_kb "$PROXY_PID") $(proc_fds "$PROXY_PID") $(proc_threads "$PROXY_PID") $(proxy_tasks)"; }

# mix PHASE SECONDS: the whole mix at once for SECONDS; wrk results in
# $LOAD_OUT/wrk-PHASE-KIND.txt, the streams' in $LOAD_OUT/sse-PHASE.txt.
mix() {
  local phase="$1" secs="$2" pids=() kind
  run_kind() {
    local kind="$1" conns="$2" body="$3" vary="$4"
    ((conns > 0)) || return 0
    run_wrk "$phase-$kind" "$URL" 1 "$conns" "$secs" "$body" "$vary"
    echo "$kind: $R_requests requests, $R_socket_errors socket errors, $R_non2xx non-2xx, p50 $R_p50_us us, p99 $R_p99_us us" \
      >"$RUN_DIR/$phase-$kind.summary"
  }
  run_kind small "$SOAK_SMALL_CONNS" "$BODIES/small.json" 0 &
  pids+=("$!")
  run_kind large "$SOAK_LARGE_CONNS" "$BODIES/large.json" 1 &
  pids+=("$!")
  run_kind invalid "$SOAK_INVALID_CONNS" "$BODIES/invalid.json" 0 &
  pids+=("$!")
  if ((SOAK_SSE_STREAMS > 0)); then
    "$SSE_BENCH" client "$URL" "$BODIES/sse.json" "$SOAK_SSE_STREAMS" "${SSE_EVENTS:-50}" 1 "$secs" "x-load-sse: 1" \
      >"$LOAD_OUT/sse-$phase.txt" 2>&1 &
    pids+=("$!")
  fi
  STARTED_PIDS+=("${pids[@]}")
  local failed=0 pid
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=$((failed + 1))
  done
  ((failed == 0)) || log "warning: $failed traffic generators of $phase reported errors"
}

# Samples the proxy once a second while a phase runs; keeps each figure's peak.
sample_peak() {
  local peak_rss=0 peak_fds=0 peak_threads=0 peak_tasks=0 rss fds threads tasks
  while [[ ! -e "$RUN_DIR/soak-done" ]]; do
    read -r rss fds threads tasks < <(figures)
    ((rss > peak_rss)) && peak_rss="$rss"
    ((fds > peak_fds)) && peak_fds="$fds"
    ((threads > peak_threads)) && peak_threads="$threads"
    if [[ "$tasks" == - ]]; then
      peak_tasks=-
    elif ((tasks > peak_tasks)); then
      peak_tasks="$tasks"
    fi
    echo "$peak_rss $peak_fds $peak_threads $peak_tasks" >"$RUN_DIR/soak-peak"
    echo "$(date +%s) $rss $fds $threads $tasks" >>"$LOAD_OUT/soak-samples.txt"
    sleep 1
  done
}

read -r start_rss start_fds start_threads start_tasks < <(figures)
log "warm-up: ${WARMUP_SECS}s of the mix"
mix warmup "$WARMUP_SECS"
sleep 5
read -r warm_rss warm_fds warm_threads warm_tasks < <(figures)

log "soak: ${SOAK_SECS}s of the mix"
echo "# epoch_s rss_kB fds threads tasks" >"$LOAD_OUT/soak-samples.txt"
sample_peak &
STARTED_PIDS+=("$!")
sampler="$!"
mix soak "$SOAK_SECS"
read -r end_rss end_fds end_threads end_tasks < <(figures)
touch "$RUN_DIR/soak-done"
wait "$sampler" || true
read -r peak_rss peak_fds peak_threads peak_tasks <"$RUN_DIR/soak-peak"

log "idle: ${IDLE_SECS}s"
sleep "$IDLE_SECS"
read -r idle_rss idle_fds idle_threads idle_tasks < <(figures)
alive=yes
curl -sf -o /dev/null "http://127.0.0.1:$PROXY_PORT/healthz" || alive=no

mb() { awk -v kb="$1" 'BEGIN { printf "%.1f MB", kb / 1024 }'; }
{
  echo "soak: ${SOAK_SECS}s mixed traffic after ${WARMUP_SECS}s warm-up, then ${IDLE_SECS}s idle, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
  echo
  echo "| moment | RSS | open fds | threads | tokio tasks |"
  echo "|---|---|---|---|---|"
  echo "| started, before any request | $(mb "$start_rss") | $start_fds | $start_threads | $start_tasks |"
  echo "| after warm-up (5 s quiet) | $(mb "$warm_rss") | $warm_fds | $warm_threads | $warm_tasks |"
  echo "| peak during soak (1 s samples) | $(mb "$peak_rss") | $peak_fds | $peak_threads | $peak_tasks |"
  echo "| end of soak traffic | $(mb "$end_rss") | $end_fds | $end_threads | $end_tasks |"
  echo "| after ${IDLE_SECS}s idle | $(mb "$idle_rss") | $idle_fds | $idle_threads | $idle_tasks |"
  echo
  awk -v i="$idle_rss" -v w="$warm_rss" 'BEGIN { printf "RSS after idle vs after warm-up: %+.1f%%\n", (i - w) * 100 / w }'
  echo "healthz after the soak: $alive"
  awk -v step="$(((SOAK_SECS + 9) / 10))" 'NR > 1 && (NR - 2) % step == 0 { line = line sprintf(" %ds %.0f MB;", NR - 2, $2 / 1024) }
    END { print "RSS during the soak:" line }' "$LOAD_OUT/soak-samples.txt"
  echo "traffic during the soak:"
  for kind in small large invalid; do
    [[ -f "$RUN_DIR/soak-$kind.summary" ]] && sed 's/^/  /' "$RUN_DIR/soak-$kind.summary"
  done
  [[ -f "$LOAD_OUT/sse-soak.txt" ]] && sed 's/^/  sse: /' "$LOAD_OUT/sse-soak.txt"
  echo "(threads: /proc/PID/status; tokio tasks: the proxy's compaction_proxy_tasks, with the scrape's own connection; pooled upstream connections close after 90 s unused)"
} | tee "$LOAD_OUT/soak.md"
log "results in $LOAD_OUT"
