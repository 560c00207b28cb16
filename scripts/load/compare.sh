#!/usr/bin/env bash
# Side by side, in one run: nginx as the origin (a fixed chat completion),
# nginx as a plain reverse proxy in front of it, and compaction-proxy
# (release) in front of the same origin. Same bodies, same connections, all
# on 127.0.0.1. Prints a markdown table; see docs/load.md.
#
#   scripts/load/compare.sh                 # 10 s per measurement
#   DURATION=5 WARMUP=1 scripts/load/compare.sh
#   PERF=1 scripts/load/compare.sh          # then profile the proxy (perf record -g) in one more 1 KB x 64 run
#
# Environment: DURATION (s, default 10), WARMUP (s, default 2), ROUNDS (each
# cell measured this many times, targets interleaved, median kept; default 1), CONNECTIONS
# (default 64), WRK_THREADS (default 2), PERF (0/1), PERF_FREQ (default 999),
# and those of lib.sh (PROXY_BIN, LOAD_OUT, NGINX_WORKERS, KEEP_LOGS).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
CONNECTIONS="${CONNECTIONS:-64}"
WRK_THREADS="${WRK_THREADS:-2}"
PERF="${PERF:-0}"
PERF_FREQ="${PERF_FREQ:-999}"
ROUNDS="${ROUNDS:-1}"

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
ERRORS=0

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

# measure CASE THREADS CONNECTIONS BODY VARY: for each of ROUNDS rounds, each
# target in turn: warm-up, then the measured run. Rounds interleave the
# targets, so a burst of noise on this shared machine hits all three alike;
# the table keeps each cell's median.
measure() {
  local case="$1" threads="$2" conns="$3" body="$4" vary="$5" target round
  for round in $(seq "$ROUNDS"); do
    for target in "${TARGETS[@]}"; do
      log "$case: $target, round $round of $ROUNDS (${WARMUP}s warm-up, ${DURATION}s)"
      if ((WARMUP > 0)); then
        run_wrk "$case-$target-warmup" "${URL[$target]}" "$threads" "$conns" "$WARMUP" "$body" "$vary"
      fi
      run_wrk "$case-$target-$round" "${URL[$target]}" "$threads" "$conns" "$DURATION" "$body" "$vary"
      RESULT[$case-$target-rps]+="$R_rps "
      RESULT[$case-$target-p50]+="$R_p50_us "
      RESULT[$case-$target-p99]+="$R_p99_us "
      ERRORS=$((ERRORS + R_socket_errors + R_non2xx))
    done
  done
  for target in "${TARGETS[@]}"; do
    for figure in rps p50 p99; do
      RESULT[$case-$target-$figure]="$(median ${RESULT[$case-$target-$figure]})"
    done
  done
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# An extra run of the 1 KB x 64 case with perf attached to the proxy, after
# the measured ones: perf's own cost stays out of the table.
profile_proxy() {
  log "small64: proxy again under perf record -g (${DURATION}s, not in the table)"
  perf record -F "$PERF_FREQ" -g -p "$PROXY_PID" -o "$LOAD_OUT/perf.data" -- sleep "$DURATION" \
    >"$LOAD_OUT/perf-record.log" 2>&1 &
  local perf_pid="$!"
  STARTED_PIDS+=("$perf_pid")
  run_wrk small64-proxy-perf "${URL[proxy]}" "$WRK_THREADS" "$CONNECTIONS" "$DURATION" "$BODIES/small.json" 0
  wait "$perf_pid" || log "warning: perf record failed, see $LOAD_OUT/perf-record.log"
  PERF_RPS="$R_rps"
}

measure small64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/small.json" 0
measure medium64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/medium.json" 0
measure small1 1 1 "$BODIES/small.json" 0
measure large1 1 1 "$BODIES/large.json" 1
if [[ "$PERF" == 1 ]]; then profile_proxy; fi

rps() { printf "%.0f req/s" "${RESULT[$1]}"; }
ratio() { awk -v a="${RESULT[$1]}" -v b="${RESULT[$2]}" 'BEGIN { printf "%.2f", a / b }'; }
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
added() { awk -v a="${RESULT[$1]}" -v o="${RESULT[$2]}" 'BEGIN { printf "%+.2f ms", (a - o) / 1000 }'; }

{
  echo "compaction-proxy vs nginx, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), ${DURATION}s per run, median of $ROUNDS round(s), wrk -t$WRK_THREADS -c$CONNECTIONS"
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
  echo "errors (socket errors + non-2xx, all runs): $ERRORS; the origin column of latency rows is the origin's own figure"
} | tee "$LOAD_OUT/table.md"

if [[ "$PERF" == 1 && -s "$LOAD_OUT/perf.data" ]]; then
  {
    echo "(1 KB x $CONNECTIONS case, $PERF_RPS req/s while perf recorded)"
    python3 "$LOAD_DIR/perf_summary.py" "$LOAD_OUT/perf.data"
  } | tee "$LOAD_OUT/perf-summary.txt"
fi
log "results in $LOAD_OUT"
