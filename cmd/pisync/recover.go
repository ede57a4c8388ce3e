package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/internal/natsconn"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// progressMin is the number of conversations above which a terminal gets a progress bar
// instead of a line per conversation as it finishes.
const progressMin = 5

// recoverFlags configure pisync recover.
type recoverFlags struct {
	conn     connFlags
	convs    listFlag
	all      bool
	roots    listFlag
	out      string
	gen      int
	at       string
	dryRun   bool
	force    bool
	jsonOut  bool
	dropRaw  bool
	parallel int
	follow   bool
	host     string
	httpAddr string
}

func (f *recoverFlags) register(fs *flag.FlagSet) {
	f.conn.register(fs)
	fs.Var(&f.convs, "conversation", "conversation id to recover (repeatable; PISYNC_CONVERSATION takes a ':'-separated list)")
	fs.BoolVar(&f.all, "all", false, "recover every conversation of the tenant and owner")
	registerRoots(fs, &f.roots, "session root to write under, as for pisync run: without --out, a conversation the mirror places elsewhere is refused")
	fs.StringVar(&f.out, "out", "", "rebuild under this directory in Pi's layout (--<cwd>--/<time>_<id>.jsonl); default: the original root and path, under a --root")
	fs.IntVar(&f.gen, "generation", 0, "generation to rebuild (0: the newest; a shrunk newest one is refused unless named)")
	fs.StringVar(&f.at, "at", "", "rebuild each conversation as the mirror held it at this RFC 3339 time (the mirror's clock)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "check everything, write nothing")
	fs.BoolVar(&f.force, "force", false, "overwrite differing files and accept a head mismatch (never a file holding lines the mirror lacks)")
	fs.BoolVar(&f.jsonOut, "json", false, "print a machine-readable report")
	fs.BoolVar(&f.dropRaw, "drop-raw", false, "leave out lines that are not JSON entries, so that Pi's harness reader opens the file")
	fs.IntVar(&f.parallel, "parallel", 4, "conversations recovered at once")
	fs.BoolVar(&f.follow, "follow", false, "after recovering, keep the files current as the mirror grows, until stopped (a warm standby)")
	fs.StringVar(&f.host, "host", "", "with --follow: only the conversations mirrored from this host")
	fs.StringVar(&f.httpAddr, "http-addr", "", "with --follow: serve /metrics and the status page here (e.g. 127.0.0.1:9477)")
}

// RecoverCommand rebuilds session files from the mirror (DESIGN §4). It returns nil when
// every conversation succeeded, errSilent when one was refused or failed (each says why
// in the report), and an errUsage error for a bad command line.
func RecoverCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f recoverFlags
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ids := f.convs.get()
	switch {
	case len(ids) == 0 && !f.all:
		return fmt.Errorf("%w: say which conversations: --conversation ID (repeatable) or --all; try 'pisync recover -h'", errUsage)
	case len(ids) > 0 && f.all:
		return fmt.Errorf("%w: --conversation and --all exclude each other", errUsage)
	case f.gen < 0:
		return fmt.Errorf("%w: --generation %d: want 0 (the newest) or a generation number", errUsage, f.gen)
	case f.parallel < 1:
		return fmt.Errorf("%w: --parallel %d: want at least 1", errUsage, f.parallel)
	case f.at != "" && f.gen != 0:
		return fmt.Errorf("%w: --at and --generation exclude each other", errUsage)
	case f.follow && (f.gen != 0 || f.at != "" || f.dryRun || f.force):
		return fmt.Errorf("%w: --follow keeps the newest generation current: it takes neither --generation, --at, --dry-run nor --force", errUsage)
	case !f.follow && (f.host != "" || f.httpAddr != ""):
		return fmt.Errorf("%w: --host and --http-addr go with --follow", errUsage)
	}
	var at time.Time
	if f.at != "" {
		t, err := time.Parse(time.RFC3339Nano, f.at)
		if err != nil {
			return fmt.Errorf("%w: --at %q: want an RFC 3339 time such as 2026-12-05T14:00:00Z", errUsage, f.at)
		}
		at = t
	}
	if f.follow {
		return follow(ctx, &f, ids, stdout, stderr)
	}
	m, owner, closeMirror, err := openMirror(ctx, &f.conn, "pisync recover", stderr)
	if err != nil {
		return err
	}
	defer closeMirror()
	var sel recovery.Selection
	if err := readWhenReady(ctx, &f.conn, stderr, "list the conversations", func(ctx context.Context) (err error) {
		sel, err = recovery.Select(ctx, m, ids, f.all)
		return err
	}); err != nil {
		return err
	}
	warnBadHeads(stderr, sel.BadHeads)
	var warnings []string
	for _, b := range sel.BadHeads {
		warnings = append(warnings, b.Warning())
	}
	if len(sel.Keys) == 0 {
		fmt.Fprintf(stderr, "pisync: the mirror holds no conversation of tenant %q, owner %q\n", owner.Tenant, owner.Name)
		if f.jsonOut {
			return writeJSON(stdout, recoverDoc{Conversations: []recovery.Report{}, DryRun: f.dryRun, Warnings: warnings})
		}
		return nil
	}

	opts := recovery.Options{Out: f.out, Roots: absRoots(f.roots.get()), Generation: f.gen, At: at, DryRun: f.dryRun,
		Force: f.force, DropRaw: f.dropRaw, Parallel: f.parallel}
	var bar *progressbar.ProgressBar
	if isTerminal(stderr) && len(sel.Keys) > progressMin {
		bar = progressbar.NewOptions(len(sel.Keys), progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("recovering"), progressbar.OptionShowCount(),
			progressbar.OptionClearOnFinish())
		opts.OnDone = func(recovery.Report) { _ = bar.Add(1) }
	} else if !f.jsonOut {
		// Plain lines as conversations finish (OnDone calls are serialized), so that a
		// long run shows its progress.
		opts.OnDone = func(r recovery.Report) { printReport(stdout, r) }
	}
	reports := recovery.New(m, opts).Run(ctx, sel)
	if bar != nil {
		_ = bar.Finish()
	}
	sum := recovery.Summarize(reports)
	switch {
	case f.jsonOut:
		if err := writeJSON(stdout, recoverDoc{Conversations: reports, Summary: sum, DryRun: f.dryRun, Warnings: warnings}); err != nil {
			return err
		}
	default:
		if bar != nil {
			for _, r := range reports {
				printReport(stdout, r)
			}
		}
		printSummary(stdout, sum, f.dryRun)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	if !sum.OK() {
		return errSilent
	}
	return nil
}

// recoverDoc is the --json output of recover.
type recoverDoc struct {
	Conversations []recovery.Report `json:"conversations"`
	Summary       recovery.Summary  `json:"summary"`
	DryRun        bool              `json:"dry_run"`
	Warnings      []string          `json:"warnings,omitempty"` // heads that do not decode
}

// printReport writes one conversation's outcome: a line, then indented details.
func printReport(w io.Writer, r recovery.Report) {
	var facts []string
	if r.Generation > 0 {
		facts = append(facts, fmt.Sprintf("generation %d", r.Generation))
	}
	if r.Lines > 0 {
		facts = append(facts, fmt.Sprintf("%d entries", r.Entries), fmt.Sprintf("%d placeholders", len(r.Placeholders)))
	}
	if r.HeaderSynthesized {
		facts = append(facts, "header synthesized")
	}
	if len(r.Conflicts) > 0 {
		facts = append(facts, fmt.Sprintf("%d conflicts", len(r.Conflicts)))
	}
	line := fmt.Sprintf("%-9s %s", r.Result, r.Conversation)
	if len(facts) > 0 {
		line += "  " + strings.Join(facts, ", ")
	}
	if r.Output != "" {
		line += "  → " + r.Output
	}
	fmt.Fprintln(w, line)
	detail := func(format string, a ...any) { fmt.Fprintf(w, "          "+format+"\n", a...) }
	if r.Reason != "" {
		detail("%s", r.Reason)
	}
	if r.Forced {
		detail("forced (--force)")
	}
	if len(r.Missing) > 0 {
		parts := make([]string, len(r.Missing))
		for i, m := range r.Missing {
			parts[i] = m.String()
		}
		detail("the mirror lacks ordinals %s", strings.Join(parts, ", "))
	}
	for _, p := range r.Placeholders {
		parent := p.ParentID
		if parent == "" {
			parent = "null"
		}
		detail("placeholder %s at line %d (parent %s, named by %s)", p.ID, p.Line, parent, p.ReferredBy)
	}
	for _, n := range r.Notes {
		detail("%s", n)
	}
	for _, c := range r.Conflicts {
		detail("%s: %s", c.Kind, c.Detail)
	}
	if r.Result == recovery.Refused && shrunkAny(r.History) {
		printGenerations(w, "          ", r.History)
	}
}

func shrunkAny(gens []mirror.GenInfo) bool {
	for _, g := range gens {
		if g.Shrunk != nil {
			return true
		}
	}
	return false
}

func printSummary(w io.Writer, s recovery.Summary, dryRun bool) {
	fmt.Fprintf(w, "%d conversations: %d written, %d unchanged, %d dry-run, %d refused, %d failed; %d placeholders, %d headers synthesized, %d conflicts\n",
		s.Conversations, s.Written, s.Unchanged, s.DryRun, s.Refused, s.Failed, s.Placeholders, s.Synthesized, s.Conflicts)
	if dryRun {
		fmt.Fprintln(w, "dry run: nothing was written")
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// openMirror connects to the NATS of connFlags (the embedded server's address when no URL
// is given) and binds the mirror's read API for the configured tenant and owner.
func openMirror(ctx context.Context, c *connFlags, name string, stderr io.Writer) (recovery.Mirror, mirror.Owner, func(), error) {
	names, err := mirror.NewNames(c.prefix)
	if err != nil {
		return nil, mirror.Owner{}, nil, fmt.Errorf("%w: --prefix: %v", errUsage, err)
	}
	owner, err := mirror.NewOwner(c.tenant, c.owner)
	if err != nil {
		return nil, mirror.Owner{}, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	// The connection logs from its own goroutines; the gate keeps those lines from
	// reaching stderr once the command is done with it (a deliberate close is no news).
	gate := &gatedWriter{w: stderr}
	log, err := newLogger("warn", "console", gate)
	if err != nil {
		return nil, mirror.Owner{}, nil, err
	}
	nc, err := c.connect(ctx, name, c.connectTO, log, nil, nats.CustomInboxPrefix(owner.InboxPrefix()))
	if err != nil {
		gate.close()
		return nil, mirror.Owner{}, nil, fmt.Errorf("%w (is pisync run up, or --nats set?)", err)
	}
	closeAll := func() {
		gate.close()
		nc.Close()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		closeAll()
		return nil, mirror.Owner{}, nil, fmt.Errorf("jetstream: %w", err)
	}
	// A server restarted a moment ago accepts the connection before its JetStream
	// answers: wait for it as long as for the connection.
	var m recovery.Mirror
	err = natsconn.NewJetStreamWait(log, nil).Do(ctx, c.connectTO, "bind the mirror", func(ctx context.Context) error {
		var err error
		m, err = recovery.NewMirror(ctx, js, names, owner)
		return err
	})
	if err != nil {
		closeAll()
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, mirror.Owner{}, nil, fmt.Errorf("%w at %s with prefix %q (%v); has pisync run started there?", errNoMirror, logx.URL(c.url()), c.prefix, err)
		}
		return nil, mirror.Owner{}, nil, err
	}
	return m, owner, closeAll, nil
}

// errNoMirror is wrapped when the server holds no pisync mirror (yet).
var errNoMirror = errors.New("no pisync mirror")

// readWhenReady runs a command's first read of the mirror (listing the conversations),
// again while JetStream is not ready: a cluster restarted a moment ago binds the mirror
// before every stream has its leader back. It waits as long as for the connection.
func readWhenReady(ctx context.Context, c *connFlags, stderr io.Writer, what string, op func(context.Context) error) error {
	log, err := newLogger("warn", "console", stderr)
	if err != nil {
		return err
	}
	return natsconn.NewJetStreamWait(log, nil).Retry(ctx, c.connectTO, what, op)
}

// gatedWriter passes writes through until closed, then drops them.
type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gatedWriter) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
