// Command benchtable turns the output of the benchmark suite (go test -bench, run by
// bench/run.sh) into bench/RESULTS.md: for each figure the median of the runs and its
// spread (golang.org/x/perf/benchmath), next to the target the issue sets. Nothing in the tables
// is typed by hand; the notes after the notes marker of an existing RESULTS.md are kept.
//
//	go run ./bench/benchtable -in bench-output.txt -out bench/RESULTS.md -command 'bench/run.sh'
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// notesMarker starts the hand-written part of RESULTS.md, kept across regenerations.
const notesMarker = "<!-- notes: everything below this line is kept when the tables are regenerated -->"

func main() {
	in := flag.String("in", "", "benchmark output (default: standard input)")
	out := flag.String("out", "", "RESULTS.md to write (default: standard output)")
	command := flag.String("command", "bench/run.sh", "the command that reproduces the results")
	flag.Parse()
	var r io.Reader = os.Stdin
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		r = f
	}
	res, err := parse(r)
	if err != nil {
		fatal(err)
	}
	notes := ""
	if *out != "" {
		if old, err := os.ReadFile(*out); err == nil {
			if i := strings.Index(string(old), notesMarker); i >= 0 {
				notes = string(old[i+len(notesMarker):])
			}
		}
	}
	doc := render(res, *command) + notesMarker + notes
	if !strings.HasSuffix(doc, "\n") {
		doc += "\n"
	}
	if *out == "" {
		fmt.Print(doc)
		return
	}
	if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchtable:", err)
	os.Exit(1)
}

// results are the parsed benchmark output.
type results struct {
	config map[string]string
	order  []string                        // benchmark names in order of appearance
	runs   map[string]map[string][]float64 // name → unit → one value per run
}

// gomaxprocs is the -N suffix go test adds to a benchmark's name.
var gomaxprocs = regexp.MustCompile(`-\d+$`)

// parse reads go test -bench output with benchfmt, the reader of the Go benchmark
// format: a result's values keep the units and numbers the benchmark reported (benchfmt
// would otherwise turn MB/s into B/s), and the first value of each configuration key
// ("cpu:", "go:", ...) describes the machine.
func parse(r io.Reader) (*results, error) {
	res := &results{config: map[string]string{}, runs: map[string]map[string][]float64{}}
	br := benchfmt.NewReader(r, "benchmark output")
	for br.Scan() {
		rec, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue // unit metadata, or a line broken by the benchmark's own output
		}
		for _, c := range rec.Config {
			if _, seen := res.config[c.Key]; !seen && c.File {
				res.config[c.Key] = strings.TrimSpace(string(c.Value))
			}
		}
		name := gomaxprocs.ReplaceAllString(rec.Name.String(), "")
		if res.runs[name] == nil {
			res.runs[name] = map[string][]float64{}
			res.order = append(res.order, name)
		}
		for _, v := range rec.Values {
			unit, val := v.Unit, v.Value
			if v.OrigUnit != "" {
				unit, val = v.OrigUnit, v.OrigValue
			}
			res.runs[name][unit] = append(res.runs[name][unit], val)
		}
	}
	return res, br.Err()
}

// figure is one row of a table: a unit of a benchmark, its label and its target.
type figure struct {
	unit, label string
	target      string  // "≥", "≤" or ""
	bound       float64 // the target's value
	note        string
}

// section is one case of the suite.
type section struct {
	title, bench, about string
	figures             []figure
}

var sections = []section{
	{"1. Back-fill", "Backfill",
		"Every session file mirrored from the start to fully acknowledged, in process (watcher and publisher as `pisync run` wires them), against raw `PublishMsgAsync` of exactly the same messages (subjects, headers, bodies; blob payloads put into the object store first) on a fresh server with the same storage, same window. Side order alternates from run to run.",
		[]figure{
			{unit: "entries/s", label: "pisync, entries/s"},
			{unit: "MB/s", label: "pisync, MB/s"},
			{unit: "raw-entries/s", label: "raw JetStream, entries/s"},
			{unit: "raw-MB/s", label: "raw JetStream, MB/s"},
			{unit: "ratio", label: "ratio pisync / raw", target: "≥", bound: 0.8},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"1b. Back-fill, many short sessions", "BackfillSmall",
		"The same measurement on 200 sessions × 500 entries.",
		[]figure{
			{unit: "entries/s", label: "pisync, entries/s"},
			{unit: "MB/s", label: "pisync, MB/s"},
			{unit: "raw-entries/s", label: "raw JetStream, entries/s"},
			{unit: "ratio", label: "ratio pisync / raw", target: "≥", bound: 0.6},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"2. Live latency", "LiveLatency",
		"Files receiving appends (one open-append-close per line, 200 B to 8 KiB) at a fixed total rate; latency from just before the write to the acknowledgement reaching the publisher (recorded by wrapping its JetStream context). The floor is a synchronous raw publish of lines of the same sizes at the same rate on the same server.",
		[]figure{
			{unit: "p50-ms", label: "p50, ms", target: "≤", bound: 2},
			{unit: "p99-ms", label: "p99, ms", target: "≤", bound: 10},
			{unit: "p999-ms", label: "p99.9, ms"},
			{unit: "max-ms", label: "max, ms"},
			{unit: "raw-p50-ms", label: "raw publish p50, ms"},
			{unit: "raw-p99-ms", label: "raw publish p99, ms"},
			{unit: "samples", label: "lines measured"},
			{unit: "late-writes", label: "writes over 1 ms behind schedule"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"3. Idle cost (daemon defaults)", "Idle/defaults",
		"The daemon (`pisync run`, a child process) on session files it has mirrored, no writes, from 10 s after the back-fill: its CPU time over the window as % of one core (from /proc/<pid>/stat) and its resident memory (highest VmRSS sampled each second; VmHWM for the whole run, back-fill included). With the defaults the window holds one periodic rescan (every minute) and no background verification (first pass 10 min after start).",
		[]figure{
			{unit: "cpu-%", label: "CPU, % of one core", target: "≤", bound: 1},
			{unit: "rss-MB", label: "RSS while idle, MB", target: "≤", bound: 60},
			{unit: "heap-MB", label: "Go heap in use at the end, MB"},
			{unit: "peak-rss-MB", label: "peak RSS of the run (VmHWM), MB"},
			{unit: "backfill-s", label: "back-fill before the window, s"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"3a. Idle cost with the embedded server (the default)", "Idle/embedded",
		"The same with the daemon's default, the nats-server embedded in its process (no `--nats`): its JetStream store, caches and duplicate index count in the daemon's memory. Goal: RSS while idle ≤ 70 MB. The heap row is the Go heap in use (`go_memstats_heap_inuse_bytes`) at the end of the window; the rest of the RSS is mostly the binary's own pages.",
		[]figure{
			{unit: "cpu-%", label: "CPU, % of one core", target: "≤", bound: 1},
			{unit: "rss-MB", label: "RSS while idle, MB", target: "≤", bound: 70},
			{unit: "heap-MB", label: "Go heap in use at the end, MB"},
			{unit: "peak-rss-MB", label: "peak RSS of the run (VmHWM), MB"},
			{unit: "backfill-s", label: "back-fill before the window, s"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"3b. Idle cost of a verified host", "Idle/verified",
		"The same once background verification has verified every file (`--verify-interval 15s --verify-rate 1000 --verify-first-rate 1000`, measured after two passes): later passes read a file again only if it or its conversation in the mirror changed. A pass every 15 s is 40 times as often as the default (10 min), so this bounds the daemon's cost on a verified idle host from above (the targets of item 3 are for the defaults, above). The passes allocate enough that the daemon never counts as quiet between them and keeps its back-fill heap.",
		[]figure{
			{unit: "cpu-%", label: "CPU, % of one core"},
			{unit: "rss-MB", label: "RSS while idle, MB"},
			{unit: "peak-rss-MB", label: "peak RSS of the run (VmHWM), MB"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"3c. Idle cost during the first background verification", "Idle/first-verification",
		"The same while the first verification pass reads every file (`--verify-interval 15s --verify-first-rate 20`, 20 files/s: 500 s for 10,000 files), once per file: a one-time cost, not an idle one. The default first rate, 1 file/s, spreads the same reads over 2.8 hours.",
		[]figure{
			{unit: "cpu-%", label: "CPU, % of one core"},
			{unit: "rss-MB", label: "RSS while idle, MB"},
			{unit: "peak-rss-MB", label: "peak RSS of the run (VmHWM), MB"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"4. Memory: one big session file", "BigFile",
		"One session file back-filled by the daemon (a child process): its peak resident memory (VmHWM).",
		[]figure{
			{unit: "peak-rss-MB", label: "peak RSS (VmHWM), MB", target: "≤", bound: 100},
			{unit: "MB/s", label: "back-fill, MB/s"},
			{unit: "backfill-s", label: "back-fill, s"},
			{unit: "cpu-s", label: "daemon CPU time, s"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{title: "5. Scaling", bench: "Scaling"},
	{"6. Recovery", "Recovery",
		"Every conversation of the back-fill workload, as the daemon mirrored it, rebuilt into files by the recovery package as `pisync recover --all --out DIR` does (default parallelism 4; heads listed, digests checked, atomic writes with fsync). Also without writing (`--dry-run`), and the ceiling: one ordered consumer reading every message of the owner. Lines per second, headers included.",
		[]figure{
			{unit: "entries/s", label: "recover, entries/s", target: "≥", bound: 100000, note: "required: ≥ 50,000"},
			{unit: "MB/s", label: "recover, MB/s"},
			{unit: "dry-run-entries/s", label: "recover --dry-run, entries/s"},
			{unit: "raw-read-entries/s", label: "raw read (one ordered consumer), entries/s"},
			{unit: "ratio", label: "ratio recover / raw read"},
			{unit: "dry-run-ratio", label: "ratio dry run / raw read"},
			{unit: "cpu-us/entry", label: "recover, CPU µs per line (server and client)"},
			{unit: "dry-run-cpu-us/entry", label: "recover --dry-run, CPU µs per line"},
			{unit: "raw-read-cpu-us/entry", label: "raw read, CPU µs per line"},
			{unit: "raw-read-cores", label: "raw read, cores busy"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"7. Cluster back-fill (R3)", "BackfillCluster",
		"The back-fill of item 1 against a 3-node cluster on loopback, in this process, with an R3 stream, bucket and object store, the clients connected to the stream's leader; the ceiling is raw R3 publishing of the same messages.",
		[]figure{
			{unit: "entries/s", label: "pisync, entries/s"},
			{unit: "MB/s", label: "pisync, MB/s"},
			{unit: "raw-entries/s", label: "raw JetStream R3, entries/s"},
			{unit: "raw-MB/s", label: "raw JetStream R3, MB/s"},
			{unit: "ratio", label: "ratio pisync / raw"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"9. Session store (pisync serve)", "Store",
		"The store package serving as `pisync serve` does (one replica, its own connection) on an embedded server on loopback; the client sends requests as a runtime does. Append latency, one append after the other on one session (entries of 1 KiB, Pi message entries), request to reply, in rounds of 100 alternating with Pi's JSONL append (what `JsonlSessionStorage.appendEntry` does: `appendFile` of the line, that is open, write, close, no fsync) and with a raw synchronous JetStream publish of the same message with `Nats-Expected-Last-Subject-Sequence`; ratios are store / other side. Open of a session of 10,000 entries (pages of about 1 MB asked for one after the other): cold (a replica that has never read the session) and warm (the replica that has just appended to it); the time the client waits for the replies (the store's and the network's share, the figure the goal is for), the same with the Go client's decoding in between (`encoding/json`; the Node client's is in the Node figures below), and the CPU time of the whole process (server, store and client) per open, which load on the machine inflates less than the times; against the raw read of the same session's messages through an ordered consumer on its subject (what a cold open does before it answers). Appends/s with 100 sessions appending at once (50 each, one client connection), against raw publishes with the expected sequence on as many subjects at once. This case alone: `BENCH=Store bench/run.sh`.",
		[]figure{
			{unit: "p50-ms", label: "append p50, ms"},
			{unit: "p99-ms", label: "append p99, ms", target: "≤", bound: 5},
			{unit: "raw-p50-ms", label: "raw publish (expected sequence) p50, ms"},
			{unit: "raw-p99-ms", label: "raw publish (expected sequence) p99, ms"},
			{unit: "raw-ratio-p50", label: "ratio store / raw, p50"},
			{unit: "raw-ratio-p99", label: "ratio store / raw, p99"},
			{unit: "jsonl-p50-ms", label: "Pi JSONL append p50, ms"},
			{unit: "jsonl-p99-ms", label: "Pi JSONL append p99, ms"},
			{unit: "jsonl-ratio-p50", label: "ratio store / Pi JSONL, p50"},
			{unit: "jsonl-ratio-p99", label: "ratio store / Pi JSONL, p99"},
			{unit: "open-cold-ms", label: "open of 10,000 entries, cold: replies awaited, ms", target: "≤", bound: 300},
			{unit: "open-cold-client-ms", label: "open, cold: first request to last page decoded (Go client), ms"},
			{unit: "open-cold-cpu-ms", label: "open, cold: CPU of server, store and client, ms"},
			{unit: "raw-read-ms", label: "raw read of the session (ordered consumer, bodies), ms"},
			{unit: "open-cold-raw-ratio", label: "ratio open, cold: replies awaited / raw read"},
			{unit: "open-warm-ms", label: "open of 10,000 entries, warm: replies awaited, ms", target: "≤", bound: 300},
			{unit: "open-warm-client-ms", label: "open, warm: first request to last page decoded (Go client), ms"},
			{unit: "open-warm-cpu-ms", label: "open, warm: CPU of server, store and client, ms"},
			{unit: "open-pages", label: "open, replies"},
			{unit: "appends/s", label: "appends/s, 100 sessions at once"},
			{unit: "raw-appends/s", label: "raw publishes/s, 100 subjects at once"},
			{unit: "appends-ratio", label: "ratio store / raw, appends/s"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"10. CPU per line: the per-host bill", "CPUPerLine",
		"The CPU time of the daemon process alone (`pisync run`, a child process; its rusage at exit) mirroring Pi-shaped sessions into a standalone nats-server (another child process, counted on neither side), against the CPU time of raw `PublishMsgAsync` of the same messages (reading the files and publishing; metadata computed beforehand) into a fresh standalone server in the same run. Goal: 23 µs a line, hashing included (half of Telegraf's 7.04 CPU-s for 150,300 lines), at least as fast.",
		[]figure{
			{unit: "cpu-us/line", label: "pisync, CPU µs per line", target: "≤", bound: 23},
			{unit: "cpu-s/100k-lines", label: "pisync, CPU-s per 100,000 lines"},
			{unit: "raw-cpu-us/line", label: "raw publish, CPU µs per line"},
			{unit: "cpu-ratio", label: "CPU ratio pisync / raw"},
			{unit: "pisync-s", label: "pisync, s until every line is acknowledged"},
			{unit: "raw-s", label: "raw publish, s"},
			{unit: "ratio", label: "speed ratio pisync / raw"},
			{unit: "peak-rss-MB", label: "daemon peak RSS (maxrss), MB"},
			{unit: "telegraf-cpu-us/line", label: "Telegraf (`-telegraf-bin`), CPU µs per line"},
			{unit: "telegraf-cpu-s/100k-lines", label: "Telegraf, CPU-s per 100,000 lines"},
			{unit: "telegraf-s", label: "Telegraf, s until its stream holds every line"},
			{unit: "telegraf-peak-rss-MB", label: "Telegraf peak RSS (maxrss), MB"},
			{unit: "pisync/telegraf-cpu", label: "CPU ratio pisync / Telegraf", target: "≤", bound: 0.5},
			{unit: "pisync/telegraf-s", label: "wall time ratio pisync / Telegraf", target: "≤", bound: 1},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
	{"11. Warm standby (recover --follow)", "Follow",
		"The live load of case 2 (100 files, 1,000 lines a second, written the way Pi writes) mirrored in process and followed into a second directory by the follower of `pisync recover --follow`; a line's file lag is from just before its write on the primary to its append on the standby. Then the follower is stopped while every file gains `-follow-backlog` lines, and started again: the catch-up (until every file is current, byte for byte) against one ordered consumer reading every message of the owner, in the same run.",
		[]figure{
			{unit: "p50-ms", label: "file lag p50, ms"},
			{unit: "p99-ms", label: "file lag p99, ms", target: "≤", bound: 1000},
			{unit: "max-ms", label: "file lag max, ms"},
			{unit: "lines", label: "lines measured"},
			{unit: "catch-up-entries/s", label: "catch-up, entries/s"},
			{unit: "raw-read-entries/s", label: "raw read (one ordered consumer), entries/s"},
			{unit: "catch-up-ratio", label: "ratio catch-up / raw read"},
			{unit: "others-cpu-%", label: "CPU used by other processes, % of the machine"},
		}},
}

func render(res *results, command string) string {
	var b strings.Builder
	b.WriteString("# pisync benchmark results\n\n")
	b.WriteString("Written by `bench/run.sh` (`go run ./bench/benchtable`) from the output of the benchmark suite; the numbers are not edited by hand. ")
	b.WriteString("Each figure is the **median** of the runs, with its **spread**: the 95% confidence interval of the median (distribution-free, as benchstat computes it) where there are 6 runs or more, else the lowest to the highest run. What each case measures and how is in `bench/README.md`.\n\n")
	fmt.Fprintf(&b, "To reproduce: `%s`\n\n", command)
	b.WriteString("| machine | |\n|---|---|\n")
	for _, k := range []string{"cpu", "cores", "memory", "kernel", "goos", "goarch", "go", "nats-server", "nats.go", "started", "load"} {
		if v, ok := res.config[k]; ok {
			fmt.Fprintf(&b, "| %s | %s |\n", k, v)
		}
	}
	b.WriteString("\n")
	for _, s := range sections {
		if s.bench == "Scaling" {
			scaling(&b, res)
			continue
		}
		runs := res.runs[s.bench]
		if runs == nil {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", s.title, s.about)
		if w := workload(runs); w != "" {
			fmt.Fprintf(&b, "Workload: %s.\n\n", w)
		}
		b.WriteString("| figure | median | spread | runs | target |\n|---|---:|---|---:|---|\n")
		for _, f := range s.figures {
			vs := runs[f.unit]
			if len(vs) == 0 {
				continue
			}
			med, lo, hi := stats(vs)
			target := ""
			if f.target != "" {
				ok := (f.target == "≥" && med >= f.bound) || (f.target == "≤" && med <= f.bound)
				verdict := "met"
				if !ok {
					verdict = "**missed**"
				}
				target = fmt.Sprintf("%s %s: %s", f.target, bound(f.bound), verdict)
			}
			if f.note != "" {
				target = strings.TrimPrefix(target+"; "+f.note, "; ")
			}
			fmt.Fprintf(&b, "| %s | %s | %s – %s | %d | %s |\n", f.label, num(med), num(lo), num(hi), len(vs), target)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// workload describes the constant figures of a case.
func workload(runs map[string][]float64) string {
	var parts []string
	for _, unit := range []string{"sessions", "files"} {
		if v := runs[unit]; len(v) > 0 {
			parts = append(parts, bound(v[0])+map[bool]string{true: " session file", false: " session files"}[v[0] == 1])
		}
	}
	if v := runs["lines"]; len(v) > 0 {
		parts = append(parts, bound(v[0])+" lines")
	}
	if v := runs["workload-MB"]; len(v) > 0 {
		parts = append(parts, num(v[0])+" MB")
	}
	return strings.Join(parts, ", ")
}

// scaling renders item 5: one row per file count, and the growth from one count to the
// next as a ratio to linear growth (≤ 1: no worse than linear).
func scaling(b *strings.Builder, res *results) {
	type row struct {
		n    float64
		runs map[string][]float64
	}
	var rows []row
	for _, name := range res.order {
		if n, ok := strings.CutPrefix(name, "Scaling/files="); ok {
			v, err := strconv.ParseFloat(n, 64)
			if err == nil {
				rows = append(rows, row{v, res.runs[name]})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].n < rows[j].n })
	b.WriteString("## 5. Scaling\n\n")
	b.WriteString("A fresh daemon (a child process) on N small session files (header and a few entries each, 100 per directory): the time until its watcher knows every file (`discovery`), until every byte is acknowledged (`mirrored`), and its peak resident memory (VmHWM, MB of 10⁶ bytes). Median of the runs, spread in brackets.\n\n")
	b.WriteString("| files | lines | discovery, s | mirrored, s | peak RSS, MB | entries/s | runs |\n|---:|---:|---|---|---|---:|---:|\n")
	cell := func(vs []float64) string {
		if len(vs) == 0 {
			return ""
		}
		med, lo, hi := stats(vs)
		return fmt.Sprintf("%s (%s – %s)", num(med), num(lo), num(hi))
	}
	for _, r := range rows {
		lines := ""
		if v := r.runs["lines"]; len(v) > 0 {
			lines = bound(v[0])
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %d |\n", bound(r.n), lines, cell(r.runs["discovery-s"]), cell(r.runs["mirrored-s"]),
			cell(r.runs["peak-rss-MB"]), cellMed(r.runs["entries/s"]), len(r.runs["mirrored-s"]))
	}
	if len(rows) > 1 {
		b.WriteString("\nGrowth from one count to the next, as a ratio to linear growth (time or memory added, divided by what proportional growth would add; ≤ 1 is no worse than linear):\n\n")
		b.WriteString("| from → to | discovery | mirrored | peak RSS above the smallest run |\n|---|---:|---:|---:|\n")
		base, _, _ := stats(rows[0].runs["peak-rss-MB"])
		for i := 1; i < len(rows); i++ {
			p, q := rows[i-1], rows[i]
			k := q.n / p.n
			growth := func(unit string) string {
				a, _, _ := stats(p.runs[unit])
				c, _, _ := stats(q.runs[unit])
				if a <= 0 {
					return ""
				}
				return num((c / a) / k)
			}
			mem := ""
			if i > 1 {
				a, _, _ := stats(p.runs["peak-rss-MB"])
				c, _, _ := stats(q.runs["peak-rss-MB"])
				if a-base > 0 {
					mem = num(((c - base) / (a - base)) / k)
				}
			}
			fmt.Fprintf(b, "| %s → %s | %s | %s | %s |\n", bound(p.n), bound(q.n), growth("discovery-s"), growth("mirrored-s"), mem)
		}
	}
	b.WriteString("\n")
}

func cellMed(vs []float64) string {
	if len(vs) == 0 {
		return ""
	}
	med, _, _ := stats(vs)
	return num(med)
}

// confidence is the level of the interval given as a figure's spread.
const confidence = 0.95

// stats returns the median and its spread: the distribution-free 95% confidence
// interval of the median (benchmath's AssumeNothing, as benchstat computes it) when the
// runs are enough for one (6 or more), else the lowest and highest run.
func stats(vs []float64) (med, lo, hi float64) {
	if len(vs) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	sum := benchmath.AssumeNothing.Summary(benchmath.NewSample(vs, &benchmath.DefaultThresholds), confidence)
	if len(sum.Warnings) == 0 && !math.IsInf(sum.Lo, 0) && !math.IsInf(sum.Hi, 0) {
		return sum.Center, sum.Lo, sum.Hi
	}
	return sum.Center, slices.Min(vs), slices.Max(vs)
}

// bound formats an exact number (a target, a count): as short as it is, thousands
// separated.
func bound(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	return group(intPart) + strings.TrimSuffix("."+frac, ".")
}

// group separates the thousands of an integer's digits.
func group(intPart string) string {
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var out []byte
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, byte(c))
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// num formats a figure with three significant digits, thousands separated.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v == 0:
		return "0"
	}
	digits := 2 - int(math.Floor(math.Log10(math.Abs(v))))
	if digits < 0 {
		p := math.Pow(10, float64(-digits))
		v = math.Round(v/p) * p
		digits = 0
	}
	s := strconv.FormatFloat(v, 'f', digits, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	s = group(intPart)
	if frac != "" {
		s += "." + frac
	}
	return s
}
