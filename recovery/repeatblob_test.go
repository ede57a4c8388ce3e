package recovery

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// TestRecoverRepeatedBlobEntryMovesLeaf (torture T9): an entry above the blob threshold
// that repeats an earlier entry's id is mirrored as a blob under its ordinal (L<n>), its
// type and parent kept. Pi moves its leaf to it, and so does the daemon's head; recovery
// took the envelope from the headers only, found no id, left the leaf where it was and
// refused the conversation: "head mismatch: the rebuilt file's leaf at ordinal N is …".
// The id is read from the blob, whole when the publisher reads such a line whole, else
// from its first bytes as the publisher does.
func TestRecoverRepeatedBlobEntryMovesLeaf(t *testing.T) {
	cases := []struct {
		name string
		raw  int // image bytes before base64
	}{
		{name: "blob read whole", raw: 2 << 10},
		{name: "blob above the in-memory limit", raw: session.MaxBufferedLine * 3 / 4},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTestMirror(t)
			ctx := mirrortest.Ctx(t)
			rng := rand.New(rand.NewPCG(71, uint64(i)))
			f := sessiontest.New(rng, t.TempDir(), "/home/dev/p", sessiontest.CLIV3)
			first := f.Entry(300)
			env, err := session.ScanEntry(first)
			if err != nil {
				t.Fatal(err)
			}
			big := f.ImageEntry(tc.raw)
			bigEnv, ok := session.ScanEnvelopePrefix(big[:min(len(big), 64<<10)])
			if !ok {
				t.Fatal("the image entry has no envelope")
			}
			big = bytes.Replace(big, []byte(`"id":"`+bigEnv.ID+`"`), []byte(`"id":"`+env.ID+`"`), 1)
			lines := [][]byte{f.HeaderLine("/home/dev/p"), first, f.Entry(200), big}

			m := mirrortest.MirrorFile(t, lines, 1, 1<<10)
			last := &m.Msgs[len(m.Msgs)-1]
			if last.Kind != mirror.KindBlob || last.EntryID != env.ID {
				t.Fatalf("last line mirrored as %s %s, want a blob of id %s", last.Kind, last.EntryID, env.ID)
			}
			last.EntryID = mirror.OrdinalID(last.Ordinal) // as the publisher mirrors a repeated id
			head := mirrortest.DaemonHead(lines, m, 1)
			if head.Head != env.ID {
				t.Fatalf("daemon head %s, want the repeated id %s", head.Head, env.ID)
			}
			tm.Publish(t, m, m.Msgs, &head)

			rep := New(tm.Reader, Options{Out: t.TempDir()}).One(ctx, m.Conv)
			if rep.Result != Written || rep.HeadCheck != "ok" {
				t.Fatalf("%s (%s), head check %q; want written, head ok", rep.Result, rep.Reason, rep.HeadCheck)
			}
			if got, _ := os.ReadFile(rep.Output); !bytes.Equal(got, mirrortest.JoinLines(lines)) {
				t.Error("the recovered file is not the mirrored one")
			}
		})
	}
}
