#!/usr/bin/env bash
# Instructions per request over a fixed sequence of bodies, counted by
# callgrind: every binary counted gets the same bytes in the same order, one
# request at a time, so two counts differ only by what the binaries do.
# (instructions.sh's wrk runs vary their bodies with a salt of the pid and
# $RANDOM, and how many requests a run sends depends on speed: the replay's
# work per request moves with the nonces' lengths.)
#
#   BODY=large-allnew scripts/load/instructions_fixed.sh
#   PROXY_BIN=/tmp/old BASELINE_BIN=target/release/compaction-proxy BODY=large-allnew \
#     scripts/load/instructions_fixed.sh
#
# Environment: BODY (default large-allnew), REQUESTS (counted, default 20),
# WARMUP (sent before counting, default 2), POLICY_EXTRA (lines added to the
# default policy), TOP (functions listed, default 25), BASELINE_BIN, and
# those of lib.sh. Request k's body is BODY with every __NONCE__ replaced by
# `fixed-` and k in six digits: all bodies are one length.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BODY="${BODY:-large-allnew}"
REQUESTS="${REQUESTS:-20}"
WARMUP="${WARMUP:-2}"
TOP="${TOP:-25}"
POLICY_EXTRA="${POLICY_EXTRA:-}"

raise_fd_limit
ensure_tools
command -v valgrind >/dev/null || die "valgrind is not installed (instructions.sh installs it)"
build_proxy
make_bodies

ORIGIN_PORT="$(free_port)"
start_origin "$ORIGIN_PORT"

# post URL FROM TO: request bodies FROM..TO, one after another; dies on an
# answer other than 200.
post() {
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
  log "$label: $WARMUP warm-up requests, then $REQUESTS counted"
  post "$url" 1 "$WARMUP" || die "$label: warm-up failed"
  callgrind_control --zero "$pid" >/dev/null
  post "$url" $((WARMUP + 1)) $((WARMUP + REQUESTS)) || die "$label: counted run failed"
  callgrind_control --dump "$pid" >/dev/null
  local dump total
  dump="$(ls "$out".* | sort | tail -1)"
  total="$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')"
  printf '%s\t%s\t%s\t%s\n' "$label" "$REQUESTS" "$total" "$dump" >>"$LOAD_OUT/instructions.tsv"
}

: >"$LOAD_OUT/instructions.tsv"
count proxy "$PROXY_BIN"
[[ -n "${BASELINE_BIN:-}" ]] && count baseline "$BASELINE_BIN"

echo
echo "instructions per request, $BODY body, $REQUESTS fixed requests after $WARMUP, callgrind"
while IFS=$'\t' read -r label requests total dump; do
  echo "$label: $((total / requests)) per request ($requests requests)"
done <"$LOAD_OUT/instructions.tsv"
echo
echo "the proxy's own functions, inclusive instructions per request ($(head -1 "$LOAD_OUT/instructions.tsv" | cut -f1)):"
read -r _ requests _ dump < <(head -1 "$LOAD_OUT/instructions.tsv")
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
