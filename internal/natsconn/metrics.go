package natsconn

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics describe the state of a connection. A nil *Metrics counts nothing.
type Metrics struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	disconnect prometheus.Counter
	jsReady    prometheus.Gauge
	jsNotReady prometheus.Counter
}

// NewMetrics declares the connection metrics and registers them on reg; a nil reg leaves
// them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		connected: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_nats_connected",
			Help: "1 when the connection to NATS is up, 0 otherwise.",
		}),
		reconnects: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_reconnects_total",
			Help: "Reconnections to NATS after a disconnection.",
		}),
		disconnect: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_disconnects_total",
			Help: "Disconnections from NATS.",
		}),
		jsReady: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_jetstream_ready",
			Help: "1 once JetStream has answered the start-up requests, 0 while they wait for it (a cluster without a leader, a server restarting).",
		}),
		jsNotReady: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_jetstream_not_ready_total",
			Help: "Start-up requests that found JetStream not ready yet and were retried with backoff.",
		}),
	}
}

func (m *Metrics) up() {
	if m != nil {
		m.connected.Set(1)
	}
}

func (m *Metrics) disconnected() {
	if m != nil {
		m.connected.Set(0)
		m.disconnect.Inc()
	}
}

func (m *Metrics) reconnected() {
	if m != nil {
		m.connected.Set(1)
		m.reconnects.Inc()
	}
}

func (m *Metrics) jetStreamReady() {
	if m != nil {
		m.jsReady.Set(1)
	}
}

func (m *Metrics) jetStreamNotReady() {
	if m != nil {
		m.jsReady.Set(0)
		m.jsNotReady.Inc()
	}
}
