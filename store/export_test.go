package store

import "github.com/prometheus/client_golang/prometheus"

// SetForkCopyFault makes the copy of a fork's n-th entry fail with what f returns, as a
// replica dying mid-copy or JetStream refusing the publish would (nil: never fails).
func SetForkCopyFault(s *Store, f func(n int) error) {
	if f == nil {
		s.faults.forkCopy.Store(nil)
		return
	}
	s.faults.forkCopy.Store(&f)
}

// Requests is the counter of requests of op answered with code.
func (m *Metrics) Requests(op, code string) prometheus.Counter {
	return m.requests.WithLabelValues(op, code)
}

// Repairs is pisync_store_head_repairs_total.
func (m *Metrics) Repairs() prometheus.Counter { return m.repairs }

// Truthy is JavaScript's truthiness of a JSON value, as the fork rules read it.
var Truthy = truthy

// Quota is pisync_store_quota_refusals_total{quota}.
func (m *Metrics) Quota(quota string) prometheus.Counter { return m.quota.WithLabelValues(quota) }

// PartsExpired is pisync_store_parts_expired_total.
func (m *Metrics) PartsExpired() prometheus.Counter { return m.partsExpired }
