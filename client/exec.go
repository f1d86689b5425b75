package client

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Exec runs argv to completion and returns its output. It is never retried: a lost reply
// must not run the command twice.
func (l *Lease) Exec(ctx context.Context, req apitype.ExecRequest) (apitype.ExecResult, error) {
	var res apitype.ExecResult
	err := l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "exec"), json: req, lease: l}, &res)
	return res, err
}

// Processes lists the lease's background processes.
func (l *Lease) Processes(ctx context.Context) ([]apitype.Process, error) {
	var list apitype.ProcessList
	err := l.c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(l.id, "processes"), lease: l, idempotent: true}, &list)
	return list.Processes, err
}

// Process returns the state of one process, including its output offsets.
func (l *Lease) Process(ctx context.Context, pid string) (apitype.Process, error) {
	var proc apitype.Process
	err := l.c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(l.id, "processes", escapeID(pid)), lease: l, idempotent: true}, &proc)
	return proc, err
}

// Signal sends a signal ("TERM", "KILL", …) to the process group of pid.
func (l *Lease) Signal(ctx context.Context, pid, signal string) error {
	return l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "processes", escapeID(pid), "signal"),
		json: apitype.SignalRequest{Signal: signal}, lease: l}, nil)
}

// Leftovers lists the processes the lease's finished commands left running (`server &`)
// and counts them all: Get's Leftovers and LeftoverCount.
func (l *Lease) Leftovers(ctx context.Context) ([]apitype.Leftover, int, error) {
	info, err := l.Get(ctx)
	return info.Leftovers, info.LeftoverCount, err
}

// SignalLeftover sends a signal ("TERM", "KILL", …) to one leftover process of the lease
// (a pid from Leftovers), and to none of its children. A pid that is not a leftover of
// this lease is ErrProcessNotFound.
func (l *Lease) SignalLeftover(ctx context.Context, pid int, signal string) error {
	return l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "leftovers", strconv.Itoa(pid), "signal"),
		json: apitype.SignalRequest{Signal: signal}, lease: l}, nil)
}

// Get fetches the lease's current state (usage, expiry, process count).
func (l *Lease) Get(ctx context.Context) (apitype.Lease, error) {
	return l.c.getLease(ctx, l.id, l)
}

// UsageHistory returns the lease's usage over the last hour (Client.UsageHistory).
func (l *Lease) UsageHistory(ctx context.Context) (apitype.UsageHistory, error) {
	return l.c.usageHistory(ctx, l.id, l)
}

// Renew extends the lease now by ttl (zero: the daemon's default) and keeps the fresh token.
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) (apitype.Lease, error) {
	info, err := l.c.renew(ctx, l.id, l, ttl)
	if err == nil {
		l.update(info)
	}
	return info, err
}
