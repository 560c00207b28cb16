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
# BASELINE_BIN (another compaction-proxy binary, e.g. main's, measured in the
# same run as an extra column), and those of lib.sh (PROXY_BIN, LOAD_OUT,
# NGINX_WORKERS, KEEP_LOGS).

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
if [[ -n "${BASELINE_BIN:-}" ]]; then
  BASELINE_PORT="$(free_port)"
  start_proxy "$BASELINE_PORT" "http://127.0.0.1:$ORIGIN_PORT" "$BASELINE_BIN"
  BASELINE_PID="$PROXY_PID"
fi
start_proxy "$PROXY_PORT" "http://127.0.0.1:$ORIGIN_PORT"

PATH_="/v1/chat/completions"
declare -A URL=(
  [origin]="http://127.0.0.1:$ORIGIN_PORT$PATH_"
  [nginx]="http://127.0.0.1:$NGINX_PORT$PATH_"
  [proxy]="http://127.0.0.1:$PROXY_PORT$PATH_"
)
declare -A PID=([origin]="$ORIGIN_PID" [nginx]="$NGINX_PROXY_PID" [proxy]="$PROXY_PID")
TARGETS=(origin nginx proxy)
if [[ -n "${BASELINE_BIN:-}" ]]; then
  URL[baseline]="http://127.0.0.1:$BASELINE_PORT$PATH_"
  PID[baseline]="$BASELINE_PID"
  TARGETS+=(baseline)
fi
declare -A RESULT
ERRORS=0

# Checks that the proxy treats the bodies as the table says.
expect_status() {
  local body="$1" want="$2" got target
  for target in proxy ${BASELINE_BIN:+baseline}; do
    got="$(curl -s -o /dev/null -D - -H 'content-type: application/json' --data-binary "@$body" "${URL[$target]}" |
      tr -d '\r' | awk -F': ' 'tolower($1) == "x-compaction-status" { print $2 }')"
    [[ "$got" == "$want"* ]] || die "$target, $(basename "$body"): x-compaction-status '$got', expected '$want'"
  done
}
expect_status "$BODIES/small.json" unchanged
expect_status "$BODIES/medium.json" unchanged
expect_status "$BODIES/medium-new.json" unchanged
expect_status "$BODIES/large.json" compacted
expect_status "$BODIES/large-allnew.json" compacted

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
      local ticks_before
      ticks_before="$(proc_cpu_ticks "${PID[$target]}")"
      run_wrk "$case-$target-$round" "${URL[$target]}" "$threads" "$conns" "$DURATION" "$body" "$vary"
      # CPU per request, µs: the ticks this target's processes used over the run.
      RESULT[$case-$target-cpu]+="$(awk -v t="$(($(proc_cpu_ticks "${PID[$target]}") - ticks_before))" \
        -v hz="$(getconf CLK_TCK)" -v n="$R_requests" 'BEGIN { printf "%.2f", n ? t / hz * 1e6 / n : 0 }') "
      RESULT[$case-$target-rps]+="$R_rps "
      RESULT[$case-$target-p50]+="$R_p50_us "
      RESULT[$case-$target-p99]+="$R_p99_us "
      ERRORS=$((ERRORS + R_socket_errors + R_non2xx))
    done
  done
  for target in "${TARGETS[@]}"; do
    for figure in rps p50 p99 cpu; do
      RESULT[$case-$target-$figure]="$(median ${RESULT[$case-$target-$figure]})"
    done
  done
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# An extra run of the 1 KB x 64 case with perf attached to a proxy, after
# the measured ones: perf's own cost stays out of the table.
# profile_proxy TARGET PID OUTPUT_PREFIX
profile_proxy() {
  local target="$1" pid="$2" prefix="$3"
  log "small64: $target again under perf record -g (${DURATION}s, not in the table)"
  perf record -F "$PERF_FREQ" -g -p "$pid" -o "$LOAD_OUT/$prefix.data" -- sleep "$DURATION" \
    >"$LOAD_OUT/$prefix-record.log" 2>&1 &
  local perf_pid="$!"
  STARTED_PIDS+=("$perf_pid")
  run_wrk "small64-$target-perf" "${URL[$target]}" "$WRK_THREADS" "$CONNECTIONS" "$DURATION" "$BODIES/small.json" 0
  wait "$perf_pid" || log "warning: perf record failed, see $LOAD_OUT/$prefix-record.log"
  if [[ -s "$LOAD_OUT/$prefix.data" ]]; then
    {
      echo "# $target, 1 KB x $CONNECTIONS case, $R_rps req/s while perf recorded"
      python3 "$LOAD_DIR/perf_summary.py" "$LOAD_OUT/$prefix.data"
    } >"$LOAD_OUT/$prefix-summary.txt"
  fi
}

measure small64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/small.json" 0
measure medium64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/medium.json" 0
measure mediumnew64 "$WRK_THREADS" "$CONNECTIONS" "$BODIES/medium-new.json" 1
measure small1 1 1 "$BODIES/small.json" 0
measure large1 1 1 "$BODIES/large.json" 1
measure largenew1 1 1 "$BODIES/large-allnew.json" 1
# Compactions under concurrency: a new last message (the outcome cache cannot
# answer, the history's kept word lists can), then every message new (neither can).
measure large16 "$WRK_THREADS" 16 "$BODIES/large.json" 1
measure largenew16 "$WRK_THREADS" 16 "$BODIES/large-allnew.json" 1
if [[ "$PERF" == 1 ]]; then
  profile_proxy proxy "$PROXY_PID" perf
  [[ -z "${BASELINE_BIN:-}" ]] || profile_proxy baseline "$BASELINE_PID" perf-baseline
fi

rps() { printf "%.0f req/s" "${RESULT[$1]}"; }
ratio() { awk -v a="${RESULT[$1]}" -v b="${RESULT[$2]}" 'BEGIN { printf "%.2f", a / b }'; }
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
added() { awk -v a="${RESULT[$1]}" -v o="${RESULT[$2]}" 'BEGIN { printf "%+.2f ms", (a - o) / 1000 }'; }

{
  echo "compaction-proxy vs nginx, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), ${DURATION}s per run, median of $ROUNDS round(s), wrk -t$WRK_THREADS -c$CONNECTIONS"
  echo "bodies: $(tr '\n' ';' <"$RUN_DIR/bodies.txt")"
  echo
  base_head="" base_rule=""
  if [[ -n "${BASELINE_BIN:-}" ]]; then base_head=" baseline proxy | baseline ÷ nginx proxy |"; base_rule="---|---|"; fi
  # row LABEL CASE FIGURE KIND: KIND rps gives req/s and the ratio to nginx,
  # added the figure minus the origin's.
  row() {
    local label="$1" case="$2" figure="$3" kind="$4" line
    if [[ "$kind" == rps ]]; then
      line="| $label | $(rps "$case-origin-$figure") | $(rps "$case-nginx-$figure") | $(rps "$case-proxy-$figure") | $(ratio "$case-proxy-$figure" "$case-nginx-$figure") |"
      [[ -z "${BASELINE_BIN:-}" ]] || line+=" $(rps "$case-baseline-$figure") | $(ratio "$case-baseline-$figure" "$case-nginx-$figure") |"
    else
      line="| $label | $(ms "${RESULT[$case-origin-$figure]}") | $(added "$case-nginx-$figure" "$case-origin-$figure") | $(added "$case-proxy-$figure" "$case-origin-$figure") | |"
      [[ -z "${BASELINE_BIN:-}" ]] || line+=" $(added "$case-baseline-$figure" "$case-origin-$figure") | |"
    fi
    echo "$line"
  }
  echo "| case | origin alone | nginx reverse proxy | compaction-proxy | ours ÷ nginx proxy |$base_head"
  echo "|---|---|---|---|---|$base_rule"
  row "1 KB body, $CONNECTIONS connections" small64 rps rps
  row "20 KB body, $CONNECTIONS connections" medium64 rps rps
  row "20 KB body, every request different (fits, parsed each time), $CONNECTIONS connections" mediumnew64 rps rps
  row "1 KB body, 1 connection, p50 added over origin" small1 p50 added
  row "1 KB body, 1 connection, p99 added over origin" small1 p99 added
  row "200 KB body, a new last message every request (compacted; the history as the request before), 1 connection, p50 added" large1 p50 added
  row "same, p99 added" large1 p99 added
  row "200 KB body, every message new every request (compacted; a history never seen), 1 connection, p50 added" largenew1 p50 added
  row "same, p99 added" largenew1 p99 added
  row "200 KB body, a new last message every request (compacted; the history as the request before), 16 connections" large16 rps rps
  row "200 KB body, every message new every request (compacted cold), 16 connections" largenew16 rps rps
  echo
  echo "errors (socket errors + non-2xx, all runs): $ERRORS; the origin column of latency rows is the origin's own figure"
  echo
  # CPU per request does not depend on how the 2 cores were shared out
  # between wrk, the origin and the proxy, which req/s does.
  cpu() { printf "%.1f µs" "${RESULT[$1]}"; }
  echo "CPU per request (user + system, µs, the proxy's own processes; medians as above):"
  echo
  echo "| case | nginx reverse proxy | compaction-proxy | ours ÷ nginx |${BASELINE_BIN:+ baseline proxy |}"
  echo "|---|---|---|---|${BASELINE_BIN:+---|}"
  for case in small64 medium64 mediumnew64; do
    case "$case" in
      small64) label="1 KB body, $CONNECTIONS connections" ;;
      medium64) label="20 KB body, $CONNECTIONS connections" ;;
      *) label="20 KB body, every request different, $CONNECTIONS connections" ;;
    esac
    line="| $label | $(cpu "$case-nginx-cpu") | $(cpu "$case-proxy-cpu") | $(ratio "$case-proxy-cpu" "$case-nginx-cpu") |"
    [[ -z "${BASELINE_BIN:-}" ]] || line+=" $(cpu "$case-baseline-cpu") |"
    echo "$line"
  done
} | tee "$LOAD_OUT/table.md"

for summary in "$LOAD_OUT/perf-summary.txt" "$LOAD_OUT/perf-baseline-summary.txt"; do
  [[ ! -f "$summary" ]] || { echo; cat "$summary"; }
done
log "results in $LOAD_OUT"
