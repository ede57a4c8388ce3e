#!/usr/bin/env bash
# The benchmark suite, in one command: every case of bench/README.md at full size, each
# run COUNT times (default 3), on servers embedded in the benchmark process; then
# bench/RESULTS.md is regenerated from the output (bench/results.txt, benchstat format).
#
#   bench/run.sh                          # the full suite (about 25 minutes on 2 cores)
#   COUNT=5 bench/run.sh                  # more runs per case
#   BENCH=Recovery bench/run.sh           # one case (a go test -bench pattern): its results
#                                         # replace that case's in results.txt, the rest stay
#   bench/run.sh -sessions 200 -big-mib 256   # other sizes (flags: bench/README.md)
#
# The temporary files (up to ~10 GB at full size) go to $TMPDIR and are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-3}
pattern=${BENCH:-.}
out=bench/results.txt
run=$(mktemp)
trap 'rm -f "$run"' EXIT
go test -run '^$' -bench "$pattern" -benchtime 1x -count "$count" -timeout 0 ./bench/ -args "$@" | tee "$run"
grep -q '^ok' "$run" || { echo "run.sh: the suite failed; RESULTS.md not regenerated" >&2; exit 1; }
if [ "$pattern" = . ] || [ ! -f "$out" ]; then
  cp "$run" "$out"
else
  # One case: its results replace that case's in results.txt, the others' are kept.
  awk 'FNR == NR { if (/^Benchmark/) { n = $1; sub(/-[0-9]+$/, "", n); fresh[n] = 1 }; next }
       /^Benchmark/ { n = $1; sub(/-[0-9]+$/, "", n); if (n in fresh) next }
       /^(PASS|ok|FAIL)/ { next }
       { print }' "$run" "$out" > "$out.new"
  grep '^Benchmark' "$run" >> "$out.new"
  grep '^ok' "$run" >> "$out.new"
  mv "$out.new" "$out"
fi
cmd="bench/run.sh"
[ "$count" = 3 ] || cmd="COUNT=$count $cmd"
[ "$pattern" = . ] || cmd="BENCH=$pattern $cmd"
[ $# -eq 0 ] || cmd="$cmd $*"
if [ "$pattern" != . ] && old=$(sed -n 's/^To reproduce: `\(.*\)`$/\1/p' bench/RESULTS.md 2>/dev/null) && [ -n "$old" ]; then
  cmd="$old"   # the other cases still come from that run; each section says how to rerun it alone
fi
go run ./bench/benchtable -in "$out" -out bench/RESULTS.md -command "$cmd"
echo "run.sh: bench/RESULTS.md written"
