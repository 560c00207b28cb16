# Shared pieces of the load harness: sourced by compare.sh, sse.sh and soak.sh.
#
# Everything listens on 127.0.0.1 only, on ports picked free at start. Every
# process started here is recorded and stopped by the EXIT trap, whatever way
# the script ends.
#
# Environment (all optional):
#   PROXY_BIN        use this compaction-proxy binary instead of building one
#   CARGO_TARGET_DIR where cargo builds (default: the repository's target/)
#   LOAD_OUT         directory for results (default: a new /tmp/compaction-proxy-load.XXXX)
#   KEEP_LOGS=1      keep the full per-request logs of the proxy and of nginx (default: their last 200 lines)
#   NGINX_WORKERS    worker_processes of each nginx (default: auto, one per core)

set -euo pipefail

LOAD_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$LOAD_DIR/../.." && pwd)"
LOAD_OUT="${LOAD_OUT:-$(mktemp -d /tmp/compaction-proxy-load.XXXXXX)}"
mkdir -p "$LOAD_OUT"
RUN_DIR="$LOAD_OUT/run"
mkdir -p "$RUN_DIR"
NGINX_WORKERS="${NGINX_WORKERS:-auto}"
STARTED_PIDS=()

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

stop_started() {
  local pid
  for pid in "${STARTED_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED_PIDS[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  STARTED_PIDS=()
  local big
  for big in proxy.log baseline-proxy.log nginx-proxy-access.log; do
    if [[ -f "$RUN_DIR/$big" && "${KEEP_LOGS:-0}" != 1 ]]; then
      tail -n 200 "$RUN_DIR/$big" >"$RUN_DIR/$big.tail" || true
      rm -f "$RUN_DIR/$big"
    fi
  done
}
trap 'stop_started' EXIT
trap 'exit 130' INT TERM

# Enough descriptors for 1,000 streams through a proxy (3 sockets each).
raise_fd_limit() {
  local hard
  hard="$(ulimit -Hn)"
  if [[ "$hard" == unlimited || "$hard" -gt 65536 ]]; then hard=65536; fi
  ulimit -n "$hard"
  log "ulimit -n $(ulimit -n)"
}

# wrk and nginx from Debian's packages when missing: one apt-get update, one install.
ensure_tools() {
  local missing=()
  command -v wrk >/dev/null || missing+=(wrk)
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
  command -v curl >/dev/null || missing+=(curl)
  command -v python3 >/dev/null || missing+=(python3)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
}

# The release binary, built with the locked dependencies.
build_proxy() {
  if [[ -n "${PROXY_BIN:-}" ]]; then
    [[ -x "$PROXY_BIN" ]] || die "PROXY_BIN=$PROXY_BIN is not executable"
    return
  fi
  log "building the release binary (cargo build --release --locked)"
  (cd "$REPO_DIR" && cargo build --release --locked --quiet)
  PROXY_BIN="${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/compaction-proxy"
  [[ -x "$PROXY_BIN" ]] || die "no binary at $PROXY_BIN"
}

# The streaming origin and client (sse-bench/, its own small crate).
build_sse_bench() {
  log "building sse-bench (cargo build --release --locked)"
  (cd "$LOAD_DIR/sse-bench" && cargo build --release --locked --quiet)
  SSE_BENCH="${CARGO_TARGET_DIR:-$LOAD_DIR/sse-bench/target}/release/sse-bench"
  [[ -x "$SSE_BENCH" ]] || die "no binary at $SSE_BENCH"
}

# start_sse_origin PORT: streams of SSE_EVENTS events SSE_INTERVAL_MS apart.
start_sse_origin() {
  local port="$1"
  start_bg sse-origin "$SSE_BENCH" origin "$port" "${SSE_EVENTS:-50}" "${SSE_INTERVAL_MS:-20}"
  SSE_ORIGIN_PID="$LAST_PID"
  wait_port "$port" "$SSE_ORIGIN_PID"
}

make_bodies() {
  BODIES="$RUN_DIR/bodies"
  python3 "$LOAD_DIR/gen_bodies.py" "$BODIES" >"$RUN_DIR/bodies.txt"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_bg NAME COMMAND...: run in the background, output to $RUN_DIR/NAME.log.
start_bg() {
  local name="$1"
  shift
  "$@" >"$RUN_DIR/$name.log" 2>&1 &
  STARTED_PIDS+=("$!")
  LAST_PID="$!"
}

wait_http() {
  local url="$1" pid="$2"
  for _ in $(seq 200); do
    if curl -s -o /dev/null --max-time 1 "$url"; then return 0; fi
    kill -0 "$pid" 2>/dev/null || die "process $pid for $url exited; see $RUN_DIR"
    sleep 0.05
  done
  die "$url did not answer"
}

wait_port() {
  local port="$1" pid="$2"
  for _ in $(seq 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || die "process $pid for port $port exited; see $RUN_DIR"
    sleep 0.05
  done
  die "nothing listens on 127.0.0.1:$port"
}

# The fixed chat completion every JSON request gets from the origin.
COMPLETION='{"id":"chatcmpl-load","object":"chat.completion","created":1764460800,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Your package DE-4471 left the Hamburg depot this morning and is scheduled for delivery on Friday."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":251,"completion_tokens":21,"total_tokens":272}}'

nginx_common() {
  local name="$1"
  if [[ "$(id -u)" == 0 ]]; then echo "user root;"; fi
  cat <<CONF
worker_processes $NGINX_WORKERS;
pid $RUN_DIR/$name.pid;
error_log $RUN_DIR/$name-error.log warn;
events { worker_connections 16384; }
CONF
}

nginx_http_common() {
  local name="$1"
  cat <<CONF
  client_body_temp_path $RUN_DIR/$name-tmp/body;
  proxy_temp_path $RUN_DIR/$name-tmp/proxy;
  fastcgi_temp_path $RUN_DIR/$name-tmp/fastcgi;
  uwsgi_temp_path $RUN_DIR/$name-tmp/uwsgi;
  scgi_temp_path $RUN_DIR/$name-tmp/scgi;
  client_max_body_size 32m;
  client_body_buffer_size 1m;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
CONF
}

# start_origin PORT [SSE_PORT]: nginx answering every request with
# $COMPLETION; with SSE_PORT, requests carrying `x-load-sse: 1` are passed to
# the SSE origin there instead (the soak's streaming requests).
start_origin() {
  local port="$1" sse_port="${2:-}" sse_branch="" sse_location=""
  if [[ -n "$sse_port" ]]; then
    sse_branch='if ($http_x_load_sse) { rewrite ^ /__sse last; }'
    sse_location="location = /__sse {
      internal;
      proxy_pass http://127.0.0.1:$sse_port/v1/chat/completions;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
    }"
  fi
  mkdir -p "$RUN_DIR/origin-tmp"
  {
    nginx_common origin
    echo "http {"
    nginx_http_common origin
    cat <<CONF
  access_log off;
  default_type application/json;
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      $sse_branch
      return 200 '$COMPLETION';
    }
    $sse_location
  }
}
CONF
  } >"$RUN_DIR/origin.conf"
  start_bg origin "$NGINX" -p "$RUN_DIR" -c "$RUN_DIR/origin.conf" -g 'daemon off;'
  ORIGIN_PID="$LAST_PID"
  wait_http "http://127.0.0.1:$port/" "$ORIGIN_PID"
}

# start_nginx_proxy PORT ORIGIN_PORT: nginx as a plain reverse proxy:
# keepalive upstream connections, responses not buffered, request bodies
# held in memory (client_body_buffer_size 1m: no temp files) as ours does,
# one access log line per request to a buffered file as ours writes one.
start_nginx_proxy() {
  local port="$1" origin_port="$2"
  mkdir -p "$RUN_DIR/nginx-proxy-tmp"
  {
    nginx_common nginx-proxy
    echo "http {"
    nginx_http_common nginx-proxy
    cat <<CONF
  access_log $RUN_DIR/nginx-proxy-access.log combined buffer=64k flush=1s;
  upstream origin {
    server 127.0.0.1:$origin_port;
    keepalive 256;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
  } >"$RUN_DIR/nginx-proxy.conf"
  start_bg nginx-proxy "$NGINX" -p "$RUN_DIR" -c "$RUN_DIR/nginx-proxy.conf" -g 'daemon off;'
  NGINX_PROXY_PID="$LAST_PID"
  wait_http "http://127.0.0.1:$port/" "$NGINX_PROXY_PID"
}

# start_proxy PORT UPSTREAM_URL: compaction-proxy (release) with a budget of
# 100,000 chars: the 1 KB and 20 KB bodies fit it (forwarded unchanged), the
# 200 KB ones are compacted to it. Default log level, to a file.
# With a third argument, runs that binary instead (compare.sh's baseline),
# logging to its own file; PROXY_PID is the started one either way.
start_proxy() {
  local port="$1" upstream="$2" binary="${3:-$PROXY_BIN}" name="proxy"
  [[ "$binary" == "$PROXY_BIN" ]] || name="baseline-proxy"
  cat >"$RUN_DIR/$name.toml" <<CONF
[server]
listen = "127.0.0.1:$port"
shutdown_grace_secs = 2

[upstream]
url = "$upstream"

[policies.default]
budget_chars = 100000
CONF
  start_bg "$name" "$binary" serve --config "$RUN_DIR/$name.toml"
  PROXY_PID="$LAST_PID"
  wait_http "http://127.0.0.1:$port/healthz" "$PROXY_PID"
}

# run_wrk LABEL URL THREADS CONNECTIONS SECONDS BODY_FILE [VARY]
# Runs wrk with post.lua; leaves its RESULT fields in R_rps, R_p50_us, ...
# and the full output in $LOAD_OUT/wrk-LABEL.txt.
WRK_RUNS=0
run_wrk() {
  local label="$1" url="$2" threads="$3" conns="$4" secs="$5" body="$6" vary="${7:-0}"
  WRK_RUNS=$((WRK_RUNS + 1))
  LOAD_BODY="$body" LOAD_VARY="$vary" LOAD_SALT="$$-$WRK_RUNS-$RANDOM" \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s -s "$LOAD_DIR/post.lua" "$url" \
    >"$LOAD_OUT/wrk-$label.txt" 2>&1 || die "wrk $label failed: $(cat "$LOAD_OUT/wrk-$label.txt")"
  local line
  line="$(grep '^RESULT ' "$LOAD_OUT/wrk-$label.txt")" || die "wrk $label printed no RESULT"
  local field
  for field in ${line#RESULT }; do
    printf -v "R_${field%%=*}" '%s' "${field#*=}"
  done
  if [[ "$R_socket_errors" != 0 || "$R_non2xx" != 0 ]]; then
    log "warning: $label: $R_socket_errors socket errors, $R_non2xx non-2xx answers"
  fi
}

# CPU time (user + system, in clock ticks) used so far by PID and its child
# processes (nginx's workers): sampled around a run, divided by its requests.
proc_cpu_ticks() {
  local pid total=0
  for pid in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# Process figures of PID from /proc: RSS (kB), open descriptors, threads.
proc_rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
proc_threads() { awk '/^Threads:/ { print $2 }' "/proc/$1/status"; }
proc_fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
