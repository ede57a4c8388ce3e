package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// HistoryCommand lists the generations of a conversation (and of the copies mirrored
// under its clash keys, or apart after another host continued it): when each was stored,
// its entries and bytes, and which lost entries of the generation before it. `pisync
// recover --generation N` restores any.
func HistoryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var conn connFlags
	var jsonOut bool
	var convs listFlag
	fs := flag.NewFlagSet("history", flag.ContinueOnError)
	fs.SetOutput(stderr)
	conn.register(fs)
	fs.Var(&convs, "conversation", "conversation id (repeatable; or give it as the first argument)")
	fs.BoolVar(&jsonOut, "json", false, "print JSON for scripts")
	var ids []string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		ids, args = append(ids, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ids = append(ids, convs.get()...)
	if len(ids) == 0 {
		return fmt.Errorf("%w: say which conversation: pisync history ID; try 'pisync history -h'", errUsage)
	}
	m, _, closeMirror, err := openMirror(ctx, &conn, "pisync history", stderr)
	if err != nil {
		return err
	}
	defer closeMirror()
	var sel recovery.Selection
	if err := readWhenReady(ctx, &conn, stderr, "list the conversations", func(ctx context.Context) (err error) {
		sel, err = recovery.Select(ctx, m, ids, false)
		return err
	}); err != nil {
		return err
	}
	warnBadHeads(stderr, sel.BadHeads)
	var out []recovery.ConvHistory
	failed := false
	for _, key := range sel.Keys {
		h, err := recovery.History(ctx, m, key)
		if err != nil {
			fmt.Fprintf(stderr, "pisync: %s: %v\n", key, err)
			failed = true
			continue
		}
		out = append(out, h)
	}
	if len(sel.Keys) == 0 {
		fmt.Fprintf(stderr, "pisync: conversation %s: %v\n", strings.Join(ids, ", "), mirror.ErrNotFound)
		failed = true
	}
	if jsonOut {
		if out == nil {
			out = []recovery.ConvHistory{}
		}
		if err := writeJSON(stdout, struct {
			Conversations []recovery.ConvHistory `json:"conversations"`
		}{out}); err != nil {
			return err
		}
	} else {
		for i, h := range out {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			title := "conversation " + h.Key
			if h.Head != nil && h.Head.Source != "" {
				title += "  (" + h.Head.Source + " on " + h.Head.Host + ")"
			}
			fmt.Fprintln(stdout, title)
			if h.Head != nil && h.Head.DivergedFrom != nil {
				d := h.Head.DivergedFrom
				fmt.Fprintf(stdout, "  diverged: host %s's copy, mirrored apart after line %d of conversation %s (generation %d), which host %s continues\n",
					h.Head.Host, d.Ordinal, d.Key, d.Generation, d.Host)
			}
			printGenerations(stdout, "", h.Generations)
		}
	}
	if failed {
		return errSilent
	}
	return nil
}

// printGenerations writes a table of generations, each line prefixed by indent.
func printGenerations(w io.Writer, indent string, gens []mirror.GenInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sGEN\tFIRST STORED\tLAST STORED\tLINES\tENTRIES\tBYTES\tSTATE\n", indent)
	for _, g := range gens {
		state := "ok"
		if s := g.Shrunk; s != nil {
			state = fmt.Sprintf("shrunk: lacks %d entries of generation %d (%s)", s.Missing, s.From, s.Reason)
		}
		if !g.Header {
			state += ", no header"
		}
		fmt.Fprintf(tw, "%s%d\t%s\t%s\t%d\t%d\t%s\t%s\n", indent, g.Number, g.First.UTC().Format(time.RFC3339),
			g.Last.UTC().Format(time.RFC3339), g.Lines, g.Entries, humanBytes(g.Bytes), state)
	}
	_ = tw.Flush()
}
