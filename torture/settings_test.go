package torture

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Settings are the parts of a run drawn once per seed: the server side and the daemon's
// flags that change how it times out and retries.
type Settings struct {
	Cluster        bool          // 3-node cluster, R3 stream; else one server
	MaxPayload     int32         // the server's max_payload (single server)
	BlobThreshold  int           // --blob-threshold
	DupWindow      time.Duration // --duplicate-window: short, so that restarts outlive it
	AckTimeout     time.Duration // --ack-timeout
	VerifyInterval time.Duration // --verify-interval (0: off)
}

// Cluster choices of a Config.
const (
	ClusterAuto = "auto" // drawn from the seed
	ClusterOn   = "on"
	ClusterOff  = "off"
)

// DrawSettings draws the settings of seed. A max_payload below the blob threshold (the
// server cannot take some lines whole) is drawn only when smallPayload is allowed.
func DrawSettings(seed uint64, cluster string, smallPayload bool) Settings {
	rng := rand.New(rand.NewPCG(seed, 2))
	s := Settings{
		Cluster:       rng.IntN(5) == 0,
		MaxPayload:    1 << 20,
		BlobThreshold: []int{64 << 10, 128 << 10, 512 << 10}[rng.IntN(3)],
		DupWindow:     []time.Duration{2 * time.Second, 20 * time.Minute}[rng.IntN(2)],
		AckTimeout:    []time.Duration{2 * time.Second, 10 * time.Second}[rng.IntN(2)],
	}
	if rng.IntN(3) == 0 {
		s.VerifyInterval = time.Duration(5+rng.IntN(20)) * time.Second
	}
	small := rng.IntN(4) == 0
	if smallPayload && small && !s.Cluster {
		s.MaxPayload = 48 << 10 // below every threshold: some lines never fit in a message
	}
	switch cluster {
	case ClusterOn:
		s.Cluster = true
	case ClusterOff:
		s.Cluster = false
	}
	if s.Cluster {
		s.MaxPayload = 1 << 20
	}
	return s
}

func (s Settings) String() string {
	where := fmt.Sprintf("one server, max_payload %d", s.MaxPayload)
	if s.Cluster {
		where = "3-node cluster, R3"
	}
	return fmt.Sprintf("%s, blob threshold %d, duplicate window %v, ack timeout %v, verify interval %v",
		where, s.BlobThreshold, s.DupWindow, s.AckTimeout, s.VerifyInterval)
}
