package bench

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/daemontest"
)

// Case 10's third side: Telegraf's tail input and NATS output, issue 15's reference for
// the per-host bill. Telegraf is not built here (the benchmark must not need it, nor CI):
// -telegraf-bin names a binary with inputs.tail, outputs.nats, parsers.value and
// serializers.template; without it the side is skipped.

var (
	flagTelegrafBin  = flag.String("telegraf-bin", "", "CPU per line: a Telegraf binary (inputs.tail, outputs.nats, parsers.value, serializers.template) as a third side; none: skipped")
	flagTelegrafConf = flag.String("telegraf-conf", "", "CPU per line: Telegraf's configuration instead of telegrafConf; it reads ${PISYNC_BENCH_NATS_URL} and ${PISYNC_BENCH_FILES} and must publish into stream "+telegrafStream)
)

const telegrafStream = "TELEGRAF"

// telegrafConf is Telegraf tuned for throughput on a back-fill: every file read from its
// beginning, each line whole as one string field (the value parser), one JetStream
// message per line whose body is the line itself (the template serializer: of the
// formats tried the cheapest for Telegraf, 40 against 45–53 µs a line for line protocol,
// which would also carry the file's path), published asynchronously in batches of 2,000
// (1,000 and 4,000 cost the same; nats.go's jetstream API stalls past 4,000 pending; a
// synchronous publish costs three times the CPU), a flush as soon as a batch is full,
// and up to 20,000 lines read ahead of the acknowledgements.
const telegrafConf = `
[agent]
  interval = "10s"
  round_interval = false
  metric_batch_size = 2000
  metric_buffer_limit = 100000
  collection_jitter = "0s"
  flush_interval = "100ms"
  flush_jitter = "0s"
  omit_hostname = true
  quiet = true

[[inputs.tail]]
  files = ["${PISYNC_BENCH_FILES}"]
  initial_read_offset = "beginning"
  watch_method = "inotify"
  max_undelivered_lines = 20000
  path_tag = "path"
  data_format = "value"
  data_type = "string"

[[outputs.nats]]
  servers = ["${PISYNC_BENCH_NATS_URL}"]
  subject = "telegraf.lines"
  data_format = "template"
  template = '{{ .Field "value" }}'
  [outputs.nats.jetstream]
    name = "` + telegrafStream + `"
    async_publish = true
    async_ack_timeout = "30s"
`

// runTelegraf runs Telegraf on w's files against t until its stream holds every line
// (the wall time from its start), takes its peak RSS (VmHWM), then stops it (SIGTERM: it
// flushes and exits) and takes its CPU time from its rusage.
func runTelegraf(tb testing.TB, t *target, w *workload, r *cpuResult) {
	tb.Helper()
	dir := tb.TempDir()
	conf := *flagTelegrafConf
	if conf == "" {
		conf = filepath.Join(dir, "telegraf.conf")
		if err := os.WriteFile(conf, []byte(telegrafConf), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	logPath := filepath.Join(dir, "telegraf.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	logTail := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b[max(0, len(b)-4000):])
	}
	cmd := exec.Command(*flagTelegrafBin, "--config", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(daemontest.Env(), "PISYNC_BENCH_NATS_URL="+t.url,
		"PISYNC_BENCH_FILES="+filepath.Join(w.root, "*", "*.jsonl"))
	nc := t.connect(tb)
	defer nc.Close()
	js := jsOf(tb, nc)
	start := time.Now()
	exited, stopChild := startChild(tb, cmd)
	stop := func() {
		if stopChild() {
			tb.Errorf("telegraf did not stop within 30 s of SIGTERM\n%s", logTail())
		}
	}
	defer stop()
	// Done when the stream holds every line; failed when Telegraf exits first or stops
	// making progress for a minute.
	var got, seen uint64
	progressed := time.Now()
	for got < uint64(w.lines) {
		select {
		case <-exited:
			tb.Fatalf("telegraf exited with %d of %d lines stored: %v\n%s", got, w.lines, cmd.ProcessState, logTail())
		case <-time.After(50 * time.Millisecond):
		}
		got = telegrafMsgs(tb, js)
		if got > seen {
			seen, progressed = got, time.Now()
		} else if time.Since(progressed) > time.Minute {
			tb.Fatalf("telegraf stored %d of %d lines and nothing more for a minute\n%s", got, w.lines, logTail())
		}
	}
	r.telegraf = time.Since(start)
	st, err := pidStat(cmd.Process.Pid)
	if err != nil {
		tb.Fatalf("telegraf is gone: %v\n%s", err, logTail())
	}
	r.telegrafRSS = st.hwm
	stop()
	r.telegrafCPU = rusageCPU(tb, cmd.ProcessState)
	// A resent batch would store lines twice.
	if got = telegrafMsgs(tb, js); got != uint64(w.lines) {
		tb.Fatalf("%d messages in stream %s, want %d", got, telegrafStream, w.lines)
	}
}

// telegrafMsgs is the number of messages in Telegraf's stream.
func telegrafMsgs(tb testing.TB, js jetstream.JetStream) uint64 {
	tb.Helper()
	return streamMsgsOf(tb, js, telegrafStream)
}
