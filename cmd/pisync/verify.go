package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// The outcomes of verify for one file.
const (
	verifyOK          = "ok"            // the file and its mirror copy agree (lines pending or torn are not drift)
	verifyDrift       = "drift"         // they differ
	verifyNotMirrored = "not-mirrored"  // the mirror has no copy yet
	verifyMissing     = "local-missing" // mirrored from this host; the local file is gone
	verifyError       = "error"
	// A conversation of the stream without a usable head that no local file carries
	// (a file that carries one is compared with it).
	verifyNoHead = "no-head"
	// A .jsonl that is no session in any form: the daemon skips it (the reason says why).
	verifySkipped = "skipped"
)

// verifyFile is the outcome of one file (or, for no-head, one conversation of the mirror)
// in verify's output.
type verifyFile struct {
	Path   string        `json:"path,omitempty"`
	Key    string        `json:"key,omitempty"` // the conversation compared with, when it has no usable head
	Result string        `json:"result"`
	Detail string        `json:"detail,omitempty"`
	Error  string        `json:"error,omitempty"`
	Drift  *verify.Drift `json:"drift,omitempty"`
}

// verifyDoc is verify's --json output.
type verifyDoc struct {
	Files    []verifyFile   `json:"files"`
	Summary  map[string]int `json:"summary"`
	Warnings []string       `json:"warnings,omitempty"` // heads that do not decode
}

// VerifyCommand compares each local session file with its mirror copy, line by line by
// digest, and reports every drift (missing, extra, changed, order), and the conversations
// of the stream without a usable head. It returns errSilent when any file drifted or
// could not be compared, or a head does not decode.
func VerifyCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f surveyFlags
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	m, _, closeMirror, err := openMirror(ctx, &f.conn, "pisync verify", stderr)
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
	doc := verifyDoc{Files: []verifyFile{}, Summary: map[string]int{}}
	for _, b := range sv.BadHeads {
		doc.Warnings = append(doc.Warnings, b.Warning())
	}
	for _, h := range sv.Headless {
		vf := verifyFile{Key: h.Key, Result: verifyNoHead,
			Detail: fmt.Sprintf("%d lines in the stream, no usable head (%s); no local file carries its id", h.Messages, h.Reason)}
		doc.Files = append(doc.Files, vf)
		doc.Summary[vf.Result]++
		if !f.jsonOut {
			printVerify(stdout, vf)
		}
	}
	for _, p := range sv.Pairs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted: %w", err)
		}
		vf := verifyOne(ctx, m, p)
		doc.Files = append(doc.Files, vf)
		doc.Summary[vf.Result]++
		if !f.jsonOut {
			printVerify(stdout, vf)
		}
	}
	if f.jsonOut {
		if err := writeJSON(stdout, doc); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "%d files: %d ok, %d drifted, %d not mirrored, %d local missing, %d errors",
			len(doc.Files)-doc.Summary[verifyNoHead], doc.Summary[verifyOK], doc.Summary[verifyDrift], doc.Summary[verifyNotMirrored],
			doc.Summary[verifyMissing], doc.Summary[verifyError])
		if n := doc.Summary[verifySkipped]; n > 0 {
			fmt.Fprintf(stdout, ", %d skipped (not sessions)", n)
		}
		if n := doc.Summary[verifyNoHead] + len(sv.BadHeads); n > 0 {
			fmt.Fprintf(stdout, "; %d conversations without a usable head, %d heads that do not decode", doc.Summary[verifyNoHead], len(sv.BadHeads))
		}
		fmt.Fprintln(stdout)
	}
	if doc.Summary[verifyDrift] > 0 || doc.Summary[verifyError] > 0 || len(sv.BadHeads) > 0 {
		return errSilent
	}
	return nil
}

func verifyOne(ctx context.Context, m recovery.Mirror, p verify.Pair) verifyFile {
	switch {
	case p.File == nil:
		return verifyFile{Path: filepath.Join(p.Head.Root, filepath.FromSlash(p.Head.Source)), Result: verifyMissing}
	case p.File.Err != nil:
		return verifyFile{Path: p.File.Path, Result: verifyError, Error: p.File.Err.Error()}
	case p.File.Skipped != "":
		return verifyFile{Path: p.File.Path, Result: verifySkipped, Detail: "not a Pi session in any form: " + p.File.Skipped}
	case p.Head == nil && p.Headless == nil:
		return verifyFile{Path: p.File.Path, Result: verifyNotMirrored}
	}
	head, vf := p.Head, verifyFile{Path: p.File.Path, Result: verifyOK}
	if head == nil {
		head = &mirror.Head{Key: p.Headless.Key}
		vf.Key = p.Headless.Key
		vf.Detail = fmt.Sprintf("compared with conversation %s of the stream, which has no usable head (%s)", p.Headless.Key, p.Headless.Reason)
	}
	d, err := verify.Verify(ctx, m, p.File.Path, *head)
	if err != nil {
		vf.Result, vf.Error = verifyError, err.Error()
		return vf
	}
	vf.Drift = &d
	if d.Drifted() {
		vf.Result = verifyDrift
	}
	return vf
}

// printVerify writes one file's outcome and, for drift, each difference.
func printVerify(w io.Writer, vf verifyFile) {
	line := fmt.Sprintf("%-13s %s", vf.Result, vf.Path)
	if vf.Path == "" {
		line = fmt.Sprintf("%-13s conversation %s", vf.Result, vf.Key)
	}
	if d := vf.Drift; d != nil {
		var facts []string
		facts = append(facts, fmt.Sprintf("generation %d", d.Generation), fmt.Sprintf("%d lines", d.LocalLines))
		if d.PendingLines > 0 {
			facts = append(facts, fmt.Sprintf("%d pending", d.PendingLines))
		}
		if d.TornBytes > 0 {
			facts = append(facts, fmt.Sprintf("torn tail of %d bytes", d.TornBytes))
		}
		if c := d.Counts(); len(c) > 0 {
			for _, k := range []verify.DriftKind{verify.DriftMissing, verify.DriftExtra, verify.DriftChanged, verify.DriftOrder} {
				if c[k] > 0 {
					facts = append(facts, fmt.Sprintf("%d %s", c[k], k))
				}
			}
		}
		line += "  (" + strings.Join(facts, ", ") + ")"
	}
	if vf.Error != "" {
		line += ": " + vf.Error
	}
	fmt.Fprintln(w, line)
	if vf.Detail != "" {
		fmt.Fprintf(w, "              %s\n", vf.Detail)
	}
	if vf.Drift == nil {
		return
	}
	for _, it := range vf.Drift.Items {
		var where string
		switch it.Kind {
		case verify.DriftMissing:
			where = fmt.Sprintf("mirror line %d is not in the file", it.MirrorLine)
		case verify.DriftExtra:
			where = fmt.Sprintf("line %d is not in the mirror", it.Line)
		case verify.DriftChanged:
			where = fmt.Sprintf("line %d differs from mirror line %d", it.Line, it.MirrorLine)
		case verify.DriftOrder:
			where = fmt.Sprintf("line %d is mirror line %d, out of order", it.Line, it.MirrorLine)
		}
		if it.EntryID != "" {
			where += " (entry " + it.EntryID + ")"
		}
		fmt.Fprintf(w, "              %-8s %s\n", it.Kind, where)
	}
}
