package natsconn

import "github.com/prometheus/client_golang/prometheus"

// Metrics describe the state of a connection. A nil *Metrics counts nothing.
type Metrics struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	disconnect prometheus.Counter
}

// NewMetrics declares the connection metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_nats_connected",
			Help: "1 when the connection to NATS is up, 0 otherwise.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_reconnects_total",
			Help: "Reconnections to NATS after a disconnection.",
		}),
		disconnect: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_disconnects_total",
			Help: "Disconnections from NATS.",
		}),
	}
	reg.MustRegister(m.connected, m.reconnects, m.disconnect)
	return m
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
