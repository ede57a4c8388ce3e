package publisher

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// retryBackoff is the pause between retries: exponential, capped, with "equal jitter"
// (each pause drawn between half and all of a step that doubles). The jitter spreads a
// fleet that failed at the same moment; the half kept fixed makes the growth certain
// rather than likely: every pause is at least as long as the one before it until the
// step reaches the cap, and from then on between half the cap and the cap
// (TestRetryBackoffGrows). It is backoff's ExponentialBackOff centred on ¾ of each step
// with a randomization factor of ⅓, which draws from exactly [½ step, step].
type retryBackoff struct{ bo *backoff.ExponentialBackOff }

// firstRetryPause is the step of the first retry.
const firstRetryPause = 200 * time.Millisecond

func newRetryBackoff(max time.Duration) *retryBackoff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = min(firstRetryPause, max) * 3 / 4
	bo.MaxInterval = max * 3 / 4
	bo.RandomizationFactor = 1.0 / 3
	bo.Multiplier = 2
	bo.MaxElapsedTime = 0 // never stops: the files wait as long as the cluster does
	bo.Reset()
	return &retryBackoff{bo: bo}
}

// next returns the next pause and doubles the step, up to the cap.
func (b *retryBackoff) next() time.Duration { return b.bo.NextBackOff() }

// reset starts again from the first pause.
func (b *retryBackoff) reset() { b.bo.Reset() }
