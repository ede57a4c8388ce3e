package torture

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// apply runs one operation and says what it did; a Failure ends the run.
func (r *run) apply(op Op) (string, *Failure) {
	if r.cfg.Exclude[op.Kind] {
		return "excluded", nil
	}
	rng := rngFor(r.cfg.Seed, op.Index)
	if err := r.d.supervise(); err != nil {
		return "", &Failure{Guarantee: "the daemon stays up (8)", Detail: err.Error()}
	}
	if r.d.proc == nil {
		if r.downFor <= 0 || op.Kind == Check || op.Kind == Kill || op.Kind == Term || op.Kind == StateLoss {
			if err := r.d.start(); err != nil {
				r.t.Fatal(err)
			}
			r.natsFaultSinceStart = false
		}
		r.downFor--
	}
	desc, err := r.do(op.Kind, rng)
	if err != nil {
		if f, ok := err.(*Failure); ok {
			return desc, f
		}
		// The run is the only writer of the tree: an error here is the harness's own.
		r.t.Fatalf("seed %d op %d %s: %v", r.cfg.Seed, op.Index, op.Kind, err)
	}
	return desc, nil
}

// pace is a pause between Pi's appends: a few milliseconds, sometimes longer.
func pace(rng *rand.Rand) func() {
	return func() {
		d := time.Duration(rng.IntN(8)) * time.Millisecond
		if rng.IntN(20) == 0 {
			d = time.Duration(50+rng.IntN(200)) * time.Millisecond
		}
		time.Sleep(d) // the writer's pace is what is being simulated
	}
}

func (r *run) do(k Kind, rng *rand.Rand) (string, error) {
	fs := r.fs
	any := func(*file) bool { return true }
	whole := func(f *file) bool { return f.torn == nil }
	v1 := func(f *file) bool { return f.sf.Format == sessiontest.CLIV1 }
	switch k {
	case Create:
		f, err := fs.create(rng)
		return fmt.Sprintf("%s %s, %d lines", f, f.sf.Format, len(f.sf.Lines)), err
	case Check:
		return r.check()
	case Kill, StateLoss:
		r.d.kill()
		what := "SIGKILL (the follower too, started again)"
		if err := r.restartFollower(); err != nil {
			return "", err
		}
		if k == StateLoss {
			if err := os.RemoveAll(filepath.Join(r.dir, "state")); err != nil {
				return "", err
			}
			what += ", state directory removed"
		}
		// The daemon stays down while the next few operations change the tree.
		r.downFor = rng.IntN(6)
		return fmt.Sprintf("%s, down for %d operations", what, r.downFor), nil
	case Term:
		if err := r.d.term(r.deadline(60 * time.Second)); err != nil {
			return "SIGTERM", &Failure{Guarantee: "graceful shutdown (SIGTERM)", Detail: err.Error()}
		}
		r.downFor = rng.IntN(3)
		return fmt.Sprintf("SIGTERM, down for %d operations", r.downFor), nil
	case NatsRestart:
		r.natsFaultSinceStart = true
		return r.nats.fault(rng.IntN(3), time.Duration(rng.IntN(2500))*time.Millisecond), nil
	case Recover:
		r.concurrentRecover()
		return "recover --all started", nil
	case TitleFirst:
		f, err := fs.createTitled(rng)
		return fmt.Sprintf("%s title first, %d lines", f, len(f.sf.Lines)), err
	case BackfillRewrite:
		// A large file appears, and Pi rewrites it in place (one line changed to another
		// of the same length, lines appended) while the daemon's first read of it is in
		// progress: the rewrite starts after a pause of a few milliseconds.
		f, err := fs.createLarge(rng, 1500+rng.IntN(2500))
		if err != nil {
			return "", err
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // the daemon's first read runs meanwhile
		lines := append([][]byte(nil), f.sf.Lines...)
		i := 1 + rng.IntN(len(lines)-1)
		changed, ok := sameSize(rng, lines[i])
		if ok {
			lines[i] = changed
		}
		for range 3 {
			lines = append(lines, f.sf.Message(200+rng.IntN(800)))
		}
		return fmt.Sprintf("%s %d lines, line %d changed %v, rewritten during its back-fill", f, len(lines), i+1, ok),
			fs.rewriteInPlace(f, rng, f.sf.Format, lines)
	case Survey:
		r.concurrentSurvey()
		return "status and verify started", nil
	case Restore:
		return r.restore(rng)
	case RenameIn:
		if len(fs.out) == 0 {
			return "skipped: nothing outside", nil
		}
		i := rng.IntN(len(fs.out))
		f := fs.out[i]
		dst := filepath.Join(fs.roots[rng.IntN(2)], session.DirName(f.cwd), filepath.Base(f.sf.Path))
		if _, err := os.Stat(dst); err == nil {
			return "skipped: target exists", nil
		}
		if err := move(f, dst); err != nil {
			return "", err
		}
		fs.out = append(fs.out[:i], fs.out[i+1:]...)
		fs.live = append(fs.live, f)
		return fmt.Sprintf("%s back into a root", f), nil
	}

	// The rest work on one file.
	keep := any
	switch k {
	case Migrate, MigrateNew:
		keep = v1
	case RewriteSame, RewriteSameSize, RewriteResized, Truncate, Replace, Restore, HeaderOnly:
		keep = whole
	}
	f := fs.pick(rng, keep)
	if f == nil {
		return "skipped: no file for it", nil
	}
	sf := f.sf
	switch k {
	case Append:
		return f.String(), fs.appendLines(f, nil, sf.Entry(150+rng.IntN(3000)))
	case Burst:
		n := 10 + rng.IntN(90)
		var lines [][]byte
		for range n {
			lines = append(lines, sf.Entry(100+rng.IntN(1500)))
		}
		var p func()
		if rng.IntN(2) == 0 {
			p = pace(rng) // at Pi's pace rather than back to back
		}
		return fmt.Sprintf("%s %d lines", f, n), fs.appendLines(f, p, lines...)
	case Torn:
		line := sf.Message(300 + rng.IntN(4000))
		split := 1 + rng.IntN(len(line))
		if rng.IntN(4) == 0 {
			split = len(line) // everything but the newline
		}
		return fmt.Sprintf("%s %d of %d bytes", f, split, len(line)+1), fs.startTorn(f, line, split)
	case Complete:
		n := 0
		for _, g := range fs.live {
			if g.torn != nil {
				n++
				if err := fs.finish(g); err != nil {
					return "", err
				}
			}
		}
		return fmt.Sprintf("%d torn lines finished", n), nil
	case Huge:
		raw := r.set.BlobThreshold*3/4 + rng.IntN(r.set.BlobThreshold)
		if rng.IntN(8) == 0 {
			raw = 800<<10 + rng.IntN(200<<10) // above the server's max_payload once encoded
		}
		line := sf.ImageEntry(raw)
		if rng.IntN(2) == 0 {
			return fmt.Sprintf("%s %d bytes in one write", f, len(line)), fs.appendLines(f, nil, line)
		}
		// The harness writes a big line in several writes.
		if err := fs.finish(f); err != nil {
			return "", err
		}
		fs.record(line)
		full := append(line, '\n')
		for off := 0; off < len(full); {
			n := min(len(full)-off, 32<<10+rng.IntN(256<<10))
			if err := sessiontest.AppendBytes(sf.Path, full[off:off+n]); err != nil {
				return "", err
			}
			off += n
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // between the writes of one line
		}
		sf.Lines = append(sf.Lines, line)
		return fmt.Sprintf("%s %d bytes in pieces", f, len(line)), nil
	case Damaged:
		line := damaged(rng, sf)
		if err := fs.appendLines(f, nil, line); err != nil {
			return "", err
		}
		sf.Reset(sf.Format, sf.Lines)
		return fmt.Sprintf("%s %q", f, clip(line, 40)), nil
	case Glue:
		line := sf.Message(300 + rng.IntN(1000))
		frag := line[:1+rng.IntN(len(line)-1)]
		next := sf.Message(300 + rng.IntN(1000))
		return fmt.Sprintf("%s fragment of %d bytes", f, len(frag)), fs.glue(f, frag, next)
	case DupID:
		var ids []string
		for _, l := range sf.Lines[1:] {
			if env, err := session.ScanEntry(l); err == nil && env.ID != "" {
				ids = append(ids, env.ID)
			}
		}
		if len(ids) == 0 {
			return "skipped: no entry id", nil
		}
		line := sf.Message(200 + rng.IntN(500))
		env, _ := session.ScanEntry(line)
		old := ids[rng.IntN(len(ids))]
		line = bytes.Replace(line, []byte(`"id":"`+env.ID+`"`), []byte(`"id":"`+old+`"`), 1)
		if err := fs.appendLines(f, nil, line); err != nil {
			return "", err
		}
		sf.Reset(sf.Format, sf.Lines)
		return fmt.Sprintf("%s repeats %s", f, old), nil
	case RewriteSame:
		return f.String(), fs.rewriteInPlace(f, rng, sf.Format, sf.Lines)
	case RewriteSameSize, RewriteResized:
		lines := append([][]byte(nil), sf.Lines...)
		i := rng.IntN(len(lines))
		var changed []byte
		if k == RewriteSameSize {
			var ok bool
			if changed, ok = sameSize(rng, lines[i]); !ok {
				return "skipped: no timestamp in line", nil
			}
		} else {
			changed = bytes.Replace(lines[i], []byte(`"timestamp":"`), []byte(`"timestamp":"9`), 1)
			if bytes.Equal(changed, lines[i]) {
				return "skipped: no timestamp in line", nil
			}
		}
		lines[i] = changed
		return fmt.Sprintf("%s line %d of %d", f, i+1, len(lines)), fs.rewriteInPlace(f, rng, sf.Format, lines)
	case Truncate:
		if len(sf.Lines) < 2 {
			return "skipped: header only", nil
		}
		n := 1 + rng.IntN(len(sf.Lines)-1)
		f.destroyed()
		return fmt.Sprintf("%s to %d of %d lines", f, n, len(sf.Lines)), fs.rewriteInPlace(f, rng, sf.Format, sf.Lines[:n:n])
	case HeaderOnly:
		// Pi's SessionManager.open on a file it cannot parse writes a fresh header over
		// it; the session keeps its id here, so that the file stays the run's.
		at := 0
		for i, l := range sf.Lines {
			if env, err := session.ScanEntry(l); err == nil && env.Type == "session" {
				at = i
				break
			}
		}
		f.destroyed()
		return fmt.Sprintf("%s of %d lines", f, len(sf.Lines)), fs.rewriteInPlace(f, rng, sf.Format, [][]byte{sf.Lines[at]})
	case Replace:
		lines := append([][]byte(nil), sf.Lines...)
		change := rng.IntN(2) == 0 && len(lines) > 1
		if change {
			i := 1 + rng.IntN(len(lines)-1)
			lines[i] = bytes.Replace(lines[i], []byte(`"timestamp":"`), []byte(`"timestamp":"9`), 1)
		}
		lines = append(lines, sf.Entry(300))
		return fmt.Sprintf("%s changed %v", f, change), fs.replace(f, lines)
	case Migrate:
		lines, err := migrate(rng, sf.Lines)
		if err != nil {
			return "", err
		}
		return f.String(), fs.rewriteInPlace(f, rng, sessiontest.CLIV3, lines)
	case MigrateNew:
		lines, err := migrate(rng, sf.Lines)
		if err != nil {
			return "", err
		}
		fs.serial++
		path := filepath.Join(filepath.Dir(sf.Path), otherName(rng, sf.ID))
		nf := &file{n: fs.serial, sf: sf.Clone(rngFor(r.cfg.Seed^0x5eed, fs.serial), path), cwd: f.cwd, moved: true}
		fs.record(lines...)
		if err := sessiontest.AppendBytes(path, mirrortest.JoinLines(lines)); err != nil {
			return "", err
		}
		nf.sf.Reset(sessiontest.CLIV3, lines)
		nf.torn, nf.rest = nil, nil
		fs.live = append(fs.live, nf)
		keepOld := rng.IntN(2) == 0
		if !keepOld {
			if err := os.Remove(sf.Path); err != nil {
				return "", err
			}
			fs.remove(f)
		}
		return fmt.Sprintf("%s → %s, old kept %v", f, nf, keepOld), nil
	case Rename:
		dst := filepath.Join(fs.roots[rng.IntN(2)], session.DirName(fmt.Sprintf("/srv/moved-%d", rng.IntN(3))), filepath.Base(sf.Path))
		if _, err := os.Stat(dst); err == nil || dst == sf.Path {
			return "skipped: target exists", nil
		}
		return fmt.Sprintf("%s to %s", f, rel(r.dir, dst)), move(f, dst)
	case RenameOut:
		dst := filepath.Join(fs.outside, fmt.Sprintf("f%d-%s", f.n, filepath.Base(sf.Path)))
		if err := move(f, dst); err != nil {
			return "", err
		}
		fs.remove(f)
		fs.out = append(fs.out, f)
		return f.String(), nil
	case Delete:
		if err := os.Remove(sf.Path); err != nil {
			return "", err
		}
		fs.remove(f)
		return f.String(), nil
	case Copy:
		fs.serial++
		path := filepath.Join(filepath.Dir(sf.Path), otherName(rng, sf.ID))
		b, err := os.ReadFile(sf.Path)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return "", err
		}
		nf := &file{n: fs.serial, sf: sf.Clone(rngFor(r.cfg.Seed^0xc0b1, fs.serial), path), cwd: f.cwd, moved: true,
			torn: f.torn, rest: f.rest}
		fs.live = append(fs.live, nf)
		return fmt.Sprintf("%s → %s", f, nf), nil
	}
	return "", fmt.Errorf("operation %v not implemented", k)
}

// runCLI runs a pisync command against the run's server and returns its output.
func (r *run) runCLI(timeout time.Duration, args ...string) (stdout, stderr []byte, err error) {
	args = append(args, "--nats", r.nats.url(), "--tenant", tenant, "--owner", owner)
	cmd := exec.Command(r.cfg.Bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(r.deadline(timeout)):
		_ = cmd.Process.Kill()
		<-done
		err = fmt.Errorf("pisync %s still running after %v", args[0], r.deadline(timeout))
	}
	return o.Bytes(), e.Bytes(), err
}

// crashed says whether a command's stderr shows a panic or a data race.
func crashed(stderr []byte) string {
	for _, marker := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if i := bytes.Index(stderr, []byte(marker)); i >= 0 {
			return string(stderr[i:min(len(stderr), i+2000)])
		}
	}
	return ""
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func rel(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil {
		return r
	}
	return p
}
