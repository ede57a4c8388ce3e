package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/pisync/pisync/recovery"
	"github.com/pisync/pisync/verify"
)

// The outcomes of verify for one file.
const (
	verifyOK          = "ok"            // the file and its mirror copy agree (lines pending or torn are not drift)
	verifyDrift       = "drift"         // they differ
	verifyNotMirrored = "not-mirrored"  // the mirror has no copy yet
	verifyMissing     = "local-missing" // mirrored from this host; the local file is gone
	verifyError       = "error"
)

// verifyFile is the outcome of one file in verify's output.
type verifyFile struct {
	Path   string        `json:"path"`
	Result string        `json:"result"`
	Error  string        `json:"error,omitempty"`
	Drift  *verify.Drift `json:"drift,omitempty"`
}

// verifyDoc is verify's --json output.
type verifyDoc struct {
	Files   []verifyFile   `json:"files"`
	Summary map[string]int `json:"summary"`
}

// VerifyCommand compares each local session file with its mirror copy, line by line by
// digest, and reports every drift (missing, extra, changed, order). It returns errSilent
// when any file drifted or could not be compared.
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
	pairs, _, err := verify.Survey(ctx, m, f.roots.get(), f.host)
	if err != nil {
		return err
	}
	doc := verifyDoc{Files: []verifyFile{}, Summary: map[string]int{}}
	for _, p := range pairs {
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
		fmt.Fprintf(stdout, "%d files: %d ok, %d drifted, %d not mirrored, %d local missing, %d errors\n", len(doc.Files),
			doc.Summary[verifyOK], doc.Summary[verifyDrift], doc.Summary[verifyNotMirrored], doc.Summary[verifyMissing], doc.Summary[verifyError])
	}
	if doc.Summary[verifyDrift] > 0 || doc.Summary[verifyError] > 0 {
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
	case p.Head == nil:
		return verifyFile{Path: p.File.Path, Result: verifyNotMirrored}
	}
	d, err := verify.Verify(ctx, m, p.File.Path, *p.Head)
	if err != nil {
		return verifyFile{Path: p.File.Path, Result: verifyError, Error: err.Error()}
	}
	vf := verifyFile{Path: p.File.Path, Result: verifyOK, Drift: &d}
	if d.Drifted() {
		vf.Result = verifyDrift
	}
	return vf
}

// printVerify writes one file's outcome and, for drift, each difference.
func printVerify(w io.Writer, vf verifyFile) {
	line := fmt.Sprintf("%-13s %s", vf.Result, vf.Path)
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
