#!/usr/bin/env bash
# `make test-loaded`: the whole suite (make test) while stress-ng keeps LOAD_FACTOR times
# as many CPU-bound processes busy as the machine has cores, then stops them, whatever
# the suite's outcome. Reports the 1-minute load average seen during the run (sampled
# every 30 s) and exits with the suite's status. A green run here is what "stays green
# on a busy machine" means (docs/DEVELOPING.md).
set -u
cd "$(dirname "$0")/.."
factor=${LOAD_FACTOR:-2}
if ! command -v stress-ng >/dev/null 2>&1; then
  echo "test-loaded: stress-ng is not installed (apt-get install stress-ng)" >&2
  exit 1
fi
workers=$(( $(nproc) * factor ))
samples=$(mktemp)
# --timeout: should this script be killed outright, the load still ends on its own.
stress-ng --cpu "$workers" --timeout 4h --quiet &
stress=$!
( while sleep 30; do cut -d' ' -f1 /proc/loadavg >>"$samples"; done ) &
sampler=$!
stop_load() {
  kill -TERM "$stress" "$sampler" 2>/dev/null
  wait "$stress" "$sampler" 2>/dev/null
  rm -f "$samples"
}
trap stop_load EXIT
trap 'exit 130' INT TERM
echo "test-loaded: stress-ng --cpu $workers on $(nproc) cores while make test runs" >&2
start=$(date +%s)
${MAKE:-make} --no-print-directory test
status=$?
load=$(sort -n "$samples" | awk '{v[NR]=$1; s+=$1} END {if (NR) printf "min %s, mean %.1f, max %s over %d samples", v[1], s/NR, v[NR], NR}')
echo "test-loaded: make test exited $status after $(( $(date +%s) - start )) s; 1-minute load average ${load:-not sampled}" >&2
exit $status
