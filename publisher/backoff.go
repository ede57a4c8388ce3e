package publisher

import (
	"math/rand/v2"
	"time"
)

// retryBackoff is the pause between retries: exponential, capped, with "equal jitter"
// (each pause is drawn between half and all of its step). The jitter spreads a fleet
// that failed at the same moment; the half kept fixed makes the growth certain rather
// than likely: every pause is at least as long as the one before it until the step
// reaches the cap, and from then on between half the cap and the cap
// (TestRetryBackoffGrows).
type retryBackoff struct {
	initial, max time.Duration
	step         time.Duration // the upper bound of the next pause; 0: start again
}

// firstRetryPause is the step of the first retry.
const firstRetryPause = 200 * time.Millisecond

func newRetryBackoff(max time.Duration) *retryBackoff {
	return &retryBackoff{initial: min(firstRetryPause, max), max: max}
}

// next returns the next pause and doubles the step, up to the cap.
func (b *retryBackoff) next() time.Duration {
	if b.step == 0 {
		b.step = b.initial
	}
	step := b.step
	b.step = min(2*b.step, b.max)
	half := step / 2
	return half + rand.N(step-half+1)
}

// reset starts again from the first pause.
func (b *retryBackoff) reset() { b.step = 0 }
