package recovery

import (
	"path/filepath"
	"sync"
)

// maxCommitBatch bounds the files a run holds staged: each keeps two descriptors open
// (the file and its root), three when it replaces a file (that one too), until it is
// committed.
const maxCommitBatch = 32

// commitBatch makes staged files durable and puts them in place: for each, fsync, rename
// over the target, fsync of the directory, as writeAtomic promises. Done together, the
// file system does the costly part once: the write-back of every file is started first,
// so that the first fsync's journal commit covers them all and the other fsyncs find
// their data on disk already; each directory is synced once, after every rename into it.
// Each file's fsync still reports that file's errors. A file that replaces another is
// settled last (see replace): its rename is undone if the replaced file was written to
// meanwhile. It returns the error of each file; a file that failed is removed and its
// target left as it was.
func commitBatch(batch []*staged) []error {
	errs := make([]error, len(batch))
	for _, s := range batch {
		startWriteback(s.f)
	}
	for i, s := range batch {
		errs[i] = s.durable()
	}
	placed := make([]bool, len(batch))
	dirs := map[string][]int{} // absolute directory → the files renamed into it
	var order []string
	for i, s := range batch {
		if errs[i] != nil {
			continue
		}
		placed[i] = true // settled below, even if the check right after the rename failed
		if errs[i] = s.place(); errs[i] != nil {
			continue
		}
		d := filepath.Join(s.t.root, filepath.Dir(s.t.rel))
		if dirs[d] == nil {
			order = append(order, d)
		}
		dirs[d] = append(dirs[d], i)
	}
	for _, d := range order {
		s := batch[dirs[d][0]]
		if err := syncDir(s.made.root, filepath.Dir(s.t.rel)); err != nil {
			for _, i := range dirs[d] {
				errs[i] = err
			}
		}
	}
	for i, s := range batch {
		if placed[i] {
			hook("settle", s.t)
			if err := s.settle(true); err != nil {
				errs[i] = err
			}
			s.release()
		}
	}
	return errs
}

// committer commits the files a run's workers stage, in batches of what has piled up
// while the previous batch was committed: the further the workers are ahead of the disk,
// the larger the batches.
type committer struct {
	r       *Recoverer
	reports []Report
	queue   chan staging
	wg      sync.WaitGroup
}

// staging is the outcome of keys[i], its file staged.
type staging struct {
	i int
	o outcome
}

func (r *Recoverer) startCommitter(reports []Report) *committer {
	c := &committer{r: r, reports: reports, queue: make(chan staging, maxCommitBatch)}
	c.wg.Add(1)
	go c.run()
	return c
}

// add reports the outcome of keys[i], once its file is committed if it has one.
func (c *committer) add(i int, o outcome) {
	if o.staged == nil {
		c.r.done(c.reports, i, o.rep)
		return
	}
	c.queue <- staging{i, o}
}

// close commits what is queued and waits for it.
func (c *committer) close() {
	close(c.queue)
	c.wg.Wait()
}

func (c *committer) run() {
	defer c.wg.Done()
	for first := range c.queue {
		batch := []staging{first}
	more:
		for len(batch) < maxCommitBatch {
			select {
			case s, ok := <-c.queue:
				if !ok {
					break more
				}
				batch = append(batch, s)
			default:
				break more
			}
		}
		files := make([]*staged, len(batch))
		for k, s := range batch {
			files[k] = s.o.staged
		}
		for k, err := range commitBatch(files) {
			c.r.done(c.reports, batch[k].i, batch[k].o.committed(err))
		}
	}
}
