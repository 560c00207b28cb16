#!/usr/bin/env bash
# The whole harness in one go, results in one directory: the comparison
# table (compare.sh), 1,000 SSE streams (sse.sh), then the soak (soak.sh).
# Each script's environment variables apply; see docs/load.md.
#
#   scripts/load/all.sh
#   DURATION=5 SOAK_SECS=60 IDLE_SECS=30 PERF=1 scripts/load/all.sh

set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LOAD_OUT="${LOAD_OUT:-$(mktemp -d /tmp/compaction-proxy-load.XXXXXX)}"
status=0
"$here/compare.sh" || status=1
"$here/sse.sh" || status=1
"$here/soak.sh" || status=1
echo
echo "results in $LOAD_OUT: table.md, sse.md, soak.md$([[ "${PERF:-0}" == 1 ]] && echo ", perf-summary.txt")"
exit "$status"
