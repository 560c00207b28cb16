#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind: unlike req/s on
# a shared machine, the same binary and load give the same count whatever
# else runs, so two binaries compare in one number each. The proxy runs under
# callgrind in front of the nginx origin; wrk loads it, and only the measured
# run (after a warm-up) is counted. Prints the total per request and the
# proxy's own functions by inclusive cost.
#
#   scripts/load/instructions.sh                       # 1 KB body, 4 connections
#   BODY=large VARY=1 scripts/load/instructions.sh     # 200 KB, every request different (cold)
#   PROXY_BIN=/tmp/old BASELINE_BIN=target/release/compaction-proxy scripts/load/instructions.sh
#   FIXED=40 BODY=large-allnew scripts/load/instructions.sh  # 40 fixed bodies, one at a time
#
# Environment: BODY (small, medium, large; default small), VARY (1: every
# request body different), CONNECTIONS (default 4), POLICY_EXTRA (lines
# added to the default policy, e.g. 'mode = "exact"'), SECONDS_ (measured run,
# default 10; under callgrind the proxy serves ~1,000 small requests a
# second), TOP (functions listed, default 25), BASELINE_BIN (a second binary
# counted the same way, printed beside), and those of lib.sh.
#
# FIXED=N counts N fixed bodies instead of a timed wrk run: request k is BODY
# with every __NONCE__ replaced by `fixed-` and k in six digits, sent one at
# a time after WARMUP (default 2) requests. Every binary then gets the same
# bytes in the same order. wrk's runs vary their bodies with a salt of the
# pid and $RANDOM, and how many requests a run sends depends on speed, so
# under VARY=1 the replay's work per request moves with the nonces' lengths:
# use FIXED to compare two builds of a cold compaction.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BODY="${BODY:-small}"
VARY="${VARY:-0}"
CONNECTIONS="${CONNECTIONS:-4}"
SECONDS_="${SECONDS_:-10}"
FIXED="${FIXED:-}"
WARMUP="${WARMUP:-2}"
TOP="${TOP:-25}"
POLICY_EXTRA="${POLICY_EXTRA:-}"

raise_fd_limit
ensure_tools
if ! command -v valgrind >/dev/null; then
  log "installing valgrind"
  sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq valgrind >/dev/null
fi
build_proxy
make_bodies

ORIGIN_PORT="$(free_port)"
start_origin "$ORIGIN_PORT"

# post_fixed URL FROM TO: the fixed bodies FROM..TO, one after another; fails
# on an answer other than 200.
post_fixed() {
  python3 - "$1" "$BODIES/$BODY.json" "$2" "$3" <<'PY'
import http.client, sys, urllib.parse
url, path, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = open(path, "rb").read()
u = urllib.parse.urlsplit(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
for k in range(first, last + 1):
    conn.request("POST", u.path, body.replace(b"__NONCE__", b"fixed-%06d" % k),
                 {"Content-Type": "application/json",
                  "Authorization": "Bearer sk-load-harness-not-a-secret"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        sys.exit(f"request {k}: status {r.status}")
PY
}

# count LABEL BINARY: instructions per request of BINARY; the callgrind
# profile stays in $LOAD_OUT/callgrind-LABEL.
count() {
  local label="$1" binary="$2" port out
  port="$(free_port)"
  out="$LOAD_OUT/callgrind-$label"
  cat >"$RUN_DIR/$label.toml" <<CONF
[server]
listen = "127.0.0.1:$port"
shutdown_grace_secs = 1

[upstream]
url = "http://127.0.0.1:$ORIGIN_PORT"

[policies.default]
budget_chars = 100000
$POLICY_EXTRA
CONF
  start_bg "$label" valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$binary" serve --config "$RUN_DIR/$label.toml"
  local pid="$LAST_PID"
  wait_http "http://127.0.0.1:$port/healthz" "$pid"
  local url="http://127.0.0.1:$port/v1/chat/completions"
  local requests
  if [[ -n "$FIXED" ]]; then
    log "$label: $WARMUP warm-up requests, then $FIXED fixed bodies counted"
    post_fixed "$url" 1 "$WARMUP" || die "$label: warm-up failed"
    callgrind_control --zero "$pid" >/dev/null
    post_fixed "$url" $((WARMUP + 1)) $((WARMUP + FIXED)) || die "$label: counted run failed"
    callgrind_control --dump "$pid" >/dev/null
    requests="$FIXED"
  else
    log "$label: warm-up, then ${SECONDS_}s counted"
    run_wrk "$label-warm" "$url" 1 "$CONNECTIONS" 3 "$BODIES/$BODY.json" "$VARY"
    callgrind_control --zero "$pid" >/dev/null
    run_wrk "$label" "$url" 1 "$CONNECTIONS" "$SECONDS_" "$BODIES/$BODY.json" "$VARY"
    callgrind_control --dump "$pid" >/dev/null
    requests="$(grep -o 'requests=[0-9]*' "$LOAD_OUT/wrk-$label.txt" | cut -d= -f2)"
  fi
  # The dump after the zeroing is the counted part (".1"; ".0" would be the start).
  local dump
  dump="$(ls "$out".* | sort | tail -1)"
  local total
  total="$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')"
  printf '%s\t%s\t%s\t%s\n' "$label" "$requests" "$total" "$dump" >>"$LOAD_OUT/instructions.tsv"
}

: >"$LOAD_OUT/instructions.tsv"
count proxy "$PROXY_BIN"
[[ -n "${BASELINE_BIN:-}" ]] && count baseline "$BASELINE_BIN"

echo
if [[ -n "$FIXED" ]]; then
  echo "instructions per request, $BODY body, $FIXED fixed requests after $WARMUP, one at a time, callgrind"
else
  echo "instructions per request, $BODY body$([[ "$VARY" == 1 ]] && echo ' (every request different)'), $CONNECTIONS connections, callgrind"
fi
while IFS=$'\t' read -r label requests total dump; do
  echo "$label: $((total / requests)) per request ($requests requests)"
done <"$LOAD_OUT/instructions.tsv"
echo
echo "the proxy's own functions, inclusive instructions per request:"
read -r _ requests _ dump < <(head -1 "$LOAD_OUT/instructions.tsv")
# Lines are "count (share) file:function [binary]"; a function inlined into
# several files is listed once, under its largest count.
callgrind_annotate --inclusive=yes --auto=no "$dump" 2>/dev/null |
  grep -E '^ *[0-9,]+ .*compaction_proxy::' |
  awk -v n="$requests" '{
    c = $1; gsub(",", "", c)
    sub(/^ *[0-9,]+ +\([^)]*\) +/, ""); sub(/ \[[^]]*\]$/, "")
    f = substr($0, index($0, ":") + 1)
    gsub(/compaction_proxy::/, "", f)
    if (!seen[f]++) printf "%9.0f  %s\n", c / n, f
  }' | head -"$TOP"
echo
echo "profiles: $LOAD_OUT/callgrind-* (callgrind_annotate, kcachegrind)"
