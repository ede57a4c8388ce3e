#!/usr/bin/env bash
# The benchmark suite, in one command: every case of bench/README.md at full size, each
# run COUNT times (default 3), on servers embedded in the benchmark process; then
# bench/RESULTS.md is regenerated from the output (bench/results.txt, benchstat format).
#
#   bench/run.sh                          # the full suite (about 25 minutes on 2 cores)
#   COUNT=5 bench/run.sh                  # more runs per case
#   BENCH=Recovery bench/run.sh           # one case (a go test -bench pattern)
#   bench/run.sh -sessions 200 -big-mib 256   # other sizes (flags: bench/README.md)
#
# The temporary files (up to ~10 GB at full size) go to $TMPDIR and are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-3}
pattern=${BENCH:-.}
out=bench/results.txt
go test -run '^$' -bench "$pattern" -benchtime 1x -count "$count" -timeout 0 ./bench/ -args "$@" | tee "$out"
grep -q '^ok' "$out" || { echo "run.sh: the suite failed; RESULTS.md not regenerated" >&2; exit 1; }
cmd="bench/run.sh"
[ "$count" = 3 ] || cmd="COUNT=$count $cmd"
[ "$pattern" = . ] || cmd="BENCH=$pattern $cmd"
[ $# -eq 0 ] || cmd="$cmd $*"
go run ./bench/benchtable -in "$out" -out bench/RESULTS.md -command "$cmd"
echo "run.sh: bench/RESULTS.md written"
