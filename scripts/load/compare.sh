#!/usr/bin/env bash
# Side by side, in one run: nginx as the origin (a fixed chat completion),
# nginx as a plain reverse proxy in front of it, and compaction-proxy
# (release) in front of the same origin. Same bodies, same connections, all
# on 127.0.0.1. Prints a markdown table; see docs/load.md.
#
#   scripts/load/compare.sh                 # 10 s per measurement
#   DURATION=5 WARMUP=1 scripts/load/compare.sh
#   PERF=1 scripts/load/compare.sh          # also perf record -g the proxy in the 1 KB x 64 case
#
# Environment: DURATION (s, default 10), WARMUP (s, default 2), CONNECTIONS
# (default 64), WRK_THREADS (default 2), PERF (0/1), PERF_FREQ (default 999),
# and those of lib.sh (PROXY_BIN, LOAD_OUT, NGINX_WORKERS, KEEP_LOGS).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
CONNECTIONS="${CONNECTIONS:-64}"
WRK_THREADS="${WRK_THREADS:-2}"
PERF="${PERF:-0}"
PERF_FREQ="${PERF_FREQ:-999}"

raise_fd_limit
ensure_tools
build_proxy
make_bodies

ORIGIN_PORT="$(free_port)"
NGINX_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
start_origin "$ORIGIN_PORT"
start_nginx_proxy "$NGINX_PORT" "$ORIGIN_PORT"
start_proxy "$PROXY_PORT" "http://127.0.0.1:$ORIGIN_PORT"

PATH_="/v1/chat/completions"
declare -A URL=(
  [origin]="http://127.0.0.1:$ORIGIN_PORT$PATH_"
  [nginx]="http://127.0.0.1:$NGINX_PORT$PATH_"
  [proxy]="http://127.0.0.1:$PROXY_PORT$PATH_"
)
TARGETS=(origin nginx proxy)
declare -A RESULT

# Checks that the proxy treats the bodies as the table says.
expect_status() {
  local body="$1" want="$2" got
  got="$(curl -s -o /dev/null -D - -H 'content-type: application/json' --data-binary "@$body" "${URL[proxy]}" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "x-compaction-status" { print $2 }')"
  [[ "$got" == "$want"* ]] || die "$(basename "$body"): x-compaction-status '$got', expected '$want'"
}
expect_status "$BODIES/small.json" unchanged
expect_status "$BODIES/medium.json" unchanged
expect_status "$BODIES/large.json" compacted

# measure CASE THREADS CONNECTIONS BODY VARY: warm-up, then the measured run,
# for each target in turn.
measure() {
  local case="$1" threads="$2" conns="$3" body="$4" vary="$5" target
  for target in "${TARGETS[@]}"; do
    log "$case: $target (${WARMUP}s warm-up, ${DURATION}s)"
    if ((WARMUP > 0)); then
      run_wrk "$case-$target-warmup" "${URL[$target]}" "$threads" "$conns" "$WARMUP" "$body" "$vary"
    fi
    local perf_pid=""
    if [[ "$PERF" == 1 && "$target" == proxy && "$case" == small64 ]]; then
      perf record -F "$PERF_FREQ" -g -p "$PROXY_PID" -o "$LOAD_OUT/perf.data" -- sleep "$DURATION" \
        >"$LOAD_OUT/perf-record.log" 2>&1 &
      perf_pid="$!"
      STARTED_PIDS+=("$perf_pid")
    fi
    run_wrk "$case-$target" "${URL[$target]}" "$threads" "$conns" "$DURATION" "$body" "$vary"
    if [[ -n "$perf_pid" ]]; then wait "$perf_pid" || log "warning: perf record failed, see $LOAD_OUT/perf-record.log"; fi
    RESULT[$case-$target-rps]="$R_rps"
    RESULT[$case-$target-p50]="$R_p50_us"
    RESULT[$case-$target-p99]="$R_p99_us"
    RESULT[$case-$target-errors]="$((R_socket_errors + R_non2xx))"
  done
}

measure small64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/small.json" 0
measure medium64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/medium.json" 0
measure small1 1 1 "$BODIES/small.json" 0
measure large1 1 1 "$BODIES/large.json" 1

rps() { printf "%.0f req/s" "${RESULT[$1]}"; }
ratio() { awk -v a="${RESULT[$1]}" -v b="${RESULT[$2]}" 'BEGIN { printf "%.2f", a / b }'; }
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
added() { awk -v a="${RESULT[$1]}" -v o="${RESULT[$2]}" 'BEGIN { printf "%+.2f ms", (a - o) / 1000 }'; }

small_kb="$(($(stat -c %s "$BODIES/small.json") / 1024))"
{
  echo "compaction-proxy vs nginx, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, ${DURATION}s per cell, wrk -t$WRK_THREADS -c$CONNECTIONS"
  echo "bodies: $(tr '\n' ';' <"$RUN_DIR/bodies.txt")"
  echo
  echo "| case | origin alone | nginx reverse proxy | compaction-proxy | ours ÷ nginx proxy |"
  echo "|---|---|---|---|---|"
  echo "| 1 KB body, $CONNECTIONS connections | $(rps small64-origin-rps) | $(rps small64-nginx-rps) | $(rps small64-proxy-rps) | $(ratio small64-proxy-rps small64-nginx-rps) |"
  echo "| 20 KB body, $CONNECTIONS connections | $(rps medium64-origin-rps) | $(rps medium64-nginx-rps) | $(rps medium64-proxy-rps) | $(ratio medium64-proxy-rps medium64-nginx-rps) |"
  echo "| 1 KB body, 1 connection, p50 added over origin | $(ms "${RESULT[small1-origin-p50]}") | $(added small1-nginx-p50 small1-origin-p50) | $(added small1-proxy-p50 small1-origin-p50) | |"
  echo "| 1 KB body, 1 connection, p99 added over origin | $(ms "${RESULT[small1-origin-p99]}") | $(added small1-nginx-p99 small1-origin-p99) | $(added small1-proxy-p99 small1-origin-p99) | |"
  echo "| 200 KB body, every request different (compacted cold), 1 connection, p50 added | $(ms "${RESULT[large1-origin-p50]}") | $(added large1-nginx-p50 large1-origin-p50) | $(added large1-proxy-p50 large1-origin-p50) | |"
  echo "| same, p99 added | $(ms "${RESULT[large1-origin-p99]}") | $(added large1-nginx-p99 large1-origin-p99) | $(added large1-proxy-p99 large1-origin-p99) | |"
  echo
  errors=0
  for key in "${!RESULT[@]}"; do
    [[ "$key" == *-errors ]] && errors=$((errors + RESULT[$key]))
  done
  echo "errors (socket errors + non-2xx, all cells): $errors; the origin column of latency rows is the origin's own figure"
} | tee "$LOAD_OUT/table.md"

if [[ "$PERF" == 1 && -s "$LOAD_OUT/perf.data" ]]; then
  python3 "$LOAD_DIR/perf_summary.py" "$LOAD_OUT/perf.data" | tee "$LOAD_OUT/perf-summary.txt"
fi
log "results in $LOAD_OUT"
