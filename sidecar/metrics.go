package sidecar

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/lease"
)

// metrics are the daemon's Prometheus series, on a registry of its own (no globals, so
// tests can run several servers in one process).
type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	authFailures prometheus.Counter
	procStarts   *prometheus.CounterVec
	bytes        *prometheus.CounterVec
	handler      http.Handler
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_http_requests_total", Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sidecar_http_request_duration_seconds", Help: "HTTP request latency by route pattern (websockets: until the upgrade).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "method"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_auth_failures_total", Help: "Requests refused for a missing, wrong or out-of-scope credential.",
		}),
		procStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_process_starts_total", Help: "Lease processes started, by kind (exec, background, shell) and result (ok, failed).",
		}, []string{"kind", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_transfer_bytes_total", Help: "File bytes moved, by direction (in, out).",
		}, []string{"direction"}),
	}
	leases := s.opts.LeaseMetrics
	if leases == nil {
		leases = NewLeaseMetrics()
	}
	m.reg.MustRegister(m.requests, m.latency, m.authFailures, leases.events, leases.life, m.procStarts, m.bytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(newStateCollector(s))
	if s.opts.Host != nil {
		m.reg.MustRegister(isolationMetrics(s.opts.Host.Caps()))
	}
	if s.opts.Network != nil {
		m.reg.MustRegister(newNetworkCollector(s.opts.Network))
	}
	// The audit lines of execs and processes that their lease's rate limit dropped
	// (process.AuditBurst, AuditRate).
	if a, ok := s.opts.Processes.(interface{ AuditLinesDropped() int64 }); ok {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sidecar_audit_lines_dropped_total", Help: "Audit lines of execs and processes dropped by their lease's rate limit (60 lines, then 1 a second).",
		}, func() float64 { return float64(a.AuditLinesDropped()) }))
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// isolationMetrics are fixed for the daemon's life: one series per isolation layer in
// force (docs/api.md lists the names) and the Landlock ABI lease processes get.
func isolationMetrics(c sandbox.Caps) prometheus.Collector {
	layers := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sidecar_isolation_layer", Help: "1 for each isolation layer in force (the layers of /v1/info).",
	}, []string{"layer"})
	for _, l := range c.Layers {
		layers.WithLabelValues(l).Set(1)
	}
	abi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_landlock_abi", Help: "The Landlock ABI lease processes get, 0 for none.",
	})
	abi.Set(float64(c.LandlockABI))
	return collectorList{layers, abi}
}

// collectorList registers several collectors as one.
type collectorList []prometheus.Collector

func (l collectorList) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range l {
		c.Describe(ch)
	}
}

func (l collectorList) Collect(ch chan<- prometheus.Metric) {
	for _, c := range l {
		c.Collect(ch)
	}
}

// LeaseMetrics counts the lease table's events. It is made before the lease table, whose
// OnEvent is its Observe, and handed to the Server (ServerOptions.LeaseMetrics), which
// exports it with its other metrics.
type LeaseMetrics struct {
	events *prometheus.CounterVec
	life   prometheus.Histogram
}

// NewLeaseMetrics makes the lease event counters.
func NewLeaseMetrics() *LeaseMetrics {
	return &LeaseMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_lease_events_total", Help: "Lease lifecycle events: created, renewed, released, expired.",
		}, []string{"event"}),
		life: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sidecar_lease_lifetime_seconds", Help: "How long leases lived, observed when released or expired.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
	}
}

// Observe counts one event (lease.Config.OnEvent).
func (m *LeaseMetrics) Observe(e lease.Event) {
	m.events.WithLabelValues(e.Kind).Inc()
	if e.Kind == "released" || e.Kind == "expired" {
		m.life.Observe(time.Since(e.Lease.CreatedAt).Seconds())
	}
}

func (m *metrics) instrument(route string, h func(w *responseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &responseWriter{ResponseWriter: w, status: http.StatusOK}
		h(rw, r)
		m.latency.WithLabelValues(route, r.Method).Observe(time.Since(start).Seconds())
		m.requests.WithLabelValues(route, r.Method, strconv.Itoa(rw.status)).Inc()
	})
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request, _ principal) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}

// stateCollector reads gauges at scrape time: leases by state, their cgroup usage, OOM
// kills, running processes and the certificate's expiry.
type stateCollector struct {
	s                                                    *Server
	leases, memory, cpu, pids, disk, ooms, procs, expiry *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		s:      s,
		leases: d("sidecar_leases", "Leases by state.", "state"),
		memory: d("sidecar_lease_memory_bytes_total", "Memory charged to all lease cgroups."),
		cpu:    d("sidecar_lease_cpu_seconds_total", "CPU time used by all lease cgroups."),
		pids:   d("sidecar_lease_pids", "Tasks in all lease cgroups."),
		disk:   d("sidecar_lease_disk_bytes", "Disk used by all leases (workdir, /tmp, partial uploads)."),
		ooms:   d("sidecar_lease_oom_kills_total", "OOM kills in lease cgroups (live leases)."),
		procs:  d("sidecar_processes_running", "Background processes running."),
		expiry: d("sidecar_tls_cert_not_after_seconds", "Unix time at which the serving certificate expires."),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.leases, c.memory, c.cpu, c.pids, c.disk, c.ooms, c.procs, c.expiry} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	var active, expired float64
	var mem, cpu, pids, disk, ooms, procs float64
	now := s.now()
	for _, l := range s.opts.Leases.List() {
		if l.Active(now) {
			active++
		} else {
			expired++
		}
		u := s.opts.Host.Usage(context.Background(), l)
		mem += float64(u.MemoryBytes)
		cpu += u.CPUSeconds
		pids += float64(u.Pids)
		ooms += float64(u.OOMKills)
		disk += float64(u.DiskBytes)
		procs += float64(s.opts.Processes.Running(l.ID))
	}
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, active, "active")
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, expired, "expired")
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(s.opts.Leases.Retiring()), "retiring")
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(s.opts.Leases.Spares()), "spare")
	ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, mem)
	ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, cpu)
	ch <- prometheus.MustNewConstMetric(c.pids, prometheus.GaugeValue, pids)
	ch <- prometheus.MustNewConstMetric(c.disk, prometheus.GaugeValue, disk)
	ch <- prometheus.MustNewConstMetric(c.ooms, prometheus.CounterValue, ooms)
	ch <- prometheus.MustNewConstMetric(c.procs, prometheus.GaugeValue, procs)
	if s.opts.CertNotAfter != nil {
		ch <- prometheus.MustNewConstMetric(c.expiry, prometheus.GaugeValue, float64(s.opts.CertNotAfter().Unix()))
	}
}

// networkCollector reads the lease network's totals at scrape time.
type networkCollector struct {
	nw          Network
	conns, byts *prometheus.Desc
}

func newNetworkCollector(nw Network) *networkCollector {
	return &networkCollector{
		nw:    nw,
		conns: prometheus.NewDesc("sidecar_network_connections_total", "Outbound lease connections through the daemon, by verdict (allowed, denied).", []string{"verdict"}, nil),
		byts:  prometheus.NewDesc("sidecar_network_bytes_total", "Bytes through the daemon's lease egress, by direction (sent by leases, received by leases).", []string{"direction"}, nil),
	}
}

func (c *networkCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.conns; ch <- c.byts }

func (c *networkCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.nw.Totals()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(t.ConnectionsAllowed), "allowed")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(t.Denied), "denied")
	ch <- prometheus.MustNewConstMetric(c.byts, prometheus.CounterValue, float64(t.BytesSent), "sent")
	ch <- prometheus.MustNewConstMetric(c.byts, prometheus.CounterValue, float64(t.BytesReceived), "received")
}
