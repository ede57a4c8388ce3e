package natsconn

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
)

// Backoff is pisync's wait between connection attempts: exponential backoff with full
// jitter. The n-th wait is drawn uniformly from [0, min(Max, Base·2ⁿ⁻¹)].
//
// Full jitter is what spreads a fleet: after a cluster outage every daemon of the fleet
// has been retrying since the same moment, and with a fixed wait (or a little jitter
// around one) they would all come back within the same second and resume their files
// together. Drawn from the whole interval, the attempts of N daemons arrive at about
// N/Max per second once the waits reach the cap, whatever N (docs/capacity.md, the
// restart storm).
type Backoff struct {
	Base time.Duration // ceiling of the first wait (> 0)
	Max  time.Duration // ceiling of every wait
}

// Reconnect is the policy of every pisync connection: a blip of the network is over in
// a fraction of a second, a 60 s outage spreads the fleet's return over 30 s.
var Reconnect = Backoff{Base: 250 * time.Millisecond, Max: 30 * time.Second}

// Delay is the wait before attempt n (1 for the first retry). It never exceeds Max,
// and grows no further once Base·2ⁿ⁻¹ passes it.
//
// backoff/v4 draws a wait from interval·(1 ± RandomizationFactor): with a factor of 1
// around half the ceiling, that is the whole of [0, ceiling].
func (b Backoff) Delay(n int) time.Duration {
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     b.Base / 2,
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         b.Max / 2,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	} // MaxElapsedTime 0: no end, the caller decides when to give up
	bo.Reset()
	// Past 64 doublings any ceiling is capped: n's size costs nothing.
	for range min(max(n, 1), 64) - 1 {
		bo.NextBackOff()
	}
	return min(bo.NextBackOff(), b.Max)
}

// Option makes the client wait Delay(n) after its n-th round over the server list
// within one disconnection. The client counts the rounds from 1 again at each
// disconnection, so that a success resets the backoff.
func (b Backoff) Option() nats.Option {
	return nats.CustomReconnectDelay(b.Delay)
}
