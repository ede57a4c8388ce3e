package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
)

// surveyFlags are the flags of status and verify: how to reach the mirror, and which
// local files to compare with it (the roots the daemon watches, as this host).
type surveyFlags struct {
	conn    connFlags
	roots   listFlag
	host    string
	jsonOut bool
}

func (f *surveyFlags) register(fs *flag.FlagSet) {
	f.conn.register(fs)
	registerRoots(fs, &f.roots, "session root the daemon watches")
	host, _ := os.Hostname()
	fs.StringVar(&f.host, "host", host, "host name the daemon records (as for pisync run)")
	fs.BoolVar(&f.jsonOut, "json", false, "print JSON for scripts")
}

// StatusCommand shows how far the local session files are mirrored: per session its
// state, mirrored bytes and percentage, generation and lag; totals for the host and, from
// the heads bucket, for the tenant and owner over every host.
func StatusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f surveyFlags
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	m, owner, closeMirror, err := openMirror(ctx, &f.conn, "pisync status", stderr)
	if err != nil {
		return err
	}
	defer closeMirror()
	var sv verify.Surveyed
	if err := readWhenReady(ctx, &f.conn, stderr, "list the conversations", func(ctx context.Context) (err error) {
		sv, err = verify.Survey(ctx, m, f.roots.get(), f.host)
		return err
	}); err != nil {
		return err
	}
	warnBadHeads(stderr, sv.BadHeads)
	rep := verify.Status(sv, owner, f.host, time.Now().UTC())
	if f.jsonOut {
		return writeJSON(stdout, rep)
	}
	printStatus(stdout, rep)
	return nil
}

// printStatus writes the status table and the totals.
func printStatus(w io.Writer, rep verify.StatusReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tGEN\tMIRRORED\tLOCAL\t%\tLAG\tSESSION\tDETAIL")
	for _, s := range rep.Sessions {
		gen := "-"
		if s.Generation > 0 {
			gen = fmt.Sprint(s.Generation)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\n", s.State, gen, humanBytes(s.MirroredBytes),
			humanBytes(s.LocalBytes), s.Percent, humanLag(s.LagSeconds), s.Path, s.Detail)
	}
	_ = tw.Flush()
	t := rep.Local
	var states []string
	for _, st := range verify.States {
		if n := t.States[st]; n > 0 {
			states = append(states, fmt.Sprintf("%d %s", n, st))
		}
	}
	fmt.Fprintf(w, "\nhost %s: %d sessions (%s); %s of %s mirrored (%.1f%%); max lag %s\n", rep.Host, t.Sessions,
		strings.Join(states, ", "), humanBytes(t.MirroredBytes), humanBytes(t.LocalBytes), t.Percent, humanLag(t.MaxLagSeconds))
	mt := rep.Mirror
	fmt.Fprintf(w, "mirror, tenant %s, owner %s, every host: %d conversations from %d hosts, %d lines, %s; %d deleted locally",
		mt.Tenant, mt.Owner, mt.Conversations, mt.Hosts, mt.Entries, humanBytes(mt.Bytes), mt.LocalDeleted)
	if mt.WithoutHead > 0 {
		fmt.Fprintf(w, "; %d without a usable head", mt.WithoutHead)
	}
	if mt.Diverged > 0 {
		fmt.Fprintf(w, "; %d diverged copies mirrored apart", mt.Diverged)
	}
	if !mt.UpdatedAt.IsZero() {
		fmt.Fprintf(w, "; last update %s", mt.UpdatedAt.Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	for _, h := range rep.Headless {
		fmt.Fprintf(w, "  conversation %s: %d lines in the stream, no usable head (%s)\n", h.Key, h.Messages, h.Reason)
	}
}

// warnBadHeads tells of each value of the heads bucket that does not decode, naming its
// key: the conversation is listed without it.
func warnBadHeads(stderr io.Writer, bad []mirror.BadHead) {
	for _, b := range bad {
		fmt.Fprintf(stderr, "pisync: warning: %s\n", b.Warning())
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func humanLag(s float64) string {
	if s <= 0 {
		return "-"
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}
