package natsconn

import (
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
)

// Backoff is pisync's wait between connection attempts: exponential backoff with full
// jitter. The n-th wait is drawn uniformly from [0, min(Max, Base·2ⁿ⁻¹)).
//
// Full jitter is what spreads a fleet: after a cluster outage every daemon of the fleet
// has been retrying since the same moment, and with a fixed wait (or a little jitter
// around one) they would all come back within the same second and resume their files
// together. Drawn from the whole interval, the attempts of N daemons arrive at about
// N/Max per second once the waits reach the cap, whatever N (docs/capacity.md, the
// restart storm).
type Backoff struct {
	Base time.Duration // ceiling of the first wait
	Max  time.Duration // ceiling of every wait

	rand func() float64 // in [0, 1); nil: math/rand/v2
}

// Reconnect is the policy of every pisync connection: a blip of the network is over in
// a fraction of a second, a 60 s outage spreads the fleet's return over 30 s.
var Reconnect = Backoff{Base: 250 * time.Millisecond, Max: 30 * time.Second}

// Delay is the wait before attempt n (1 for the first retry). It never exceeds Max,
// and grows no further once Base·2ⁿ⁻¹ passes it (no overflow for any n).
func (b Backoff) Delay(n int) time.Duration {
	ceiling := b.Max
	if n < 1 {
		n = 1
	}
	// Base·2ⁿ⁻¹ compared without computing it past Max: shifting stops at the cap.
	if c := b.Base; c > 0 {
		for i := 1; i < n && c < b.Max; i++ {
			c *= 2
		}
		ceiling = min(c, b.Max)
	}
	if ceiling <= 0 {
		return 0
	}
	r := b.rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(r() * float64(ceiling))
}

// Option makes the client wait Delay(n) after its n-th round over the server list
// within one disconnection. The client counts the rounds from 1 again at each
// disconnection, so that a success resets the backoff.
func (b Backoff) Option() nats.Option {
	return nats.CustomReconnectDelay(b.Delay)
}
