package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// samples are the measured durations of one contender in one case.
type samples []time.Duration

// percentile is the p-th percentile (0–100) by linear interpolation between the closest
// ranks; 0 for no samples.
func (s samples) percentile(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	frac := rank - float64(lo)
	return sorted[lo] + time.Duration(frac*float64(sorted[hi]-sorted[lo]))
}

func (s samples) median() time.Duration { return s.percentile(50) }

// unit says how a row shows a duration: as a latency, or as a throughput of a known
// number of bytes (or files) per sample.
type unit struct {
	perSample float64 // bytes or files moved by one sample; 0 for a latency
	name      string  // "MB/s", "files/s"; ignored for a latency
}

var latency = unit{}

// throughput builds the unit of a case moving n things per sample.
func throughput(n float64, name string) unit { return unit{perSample: n, name: name} }

// value is d expressed in the unit: milliseconds for a latency, things per second
// (MB = 10^6 bytes) for a throughput.
func (u unit) value(d time.Duration) float64 {
	if u.perSample == 0 {
		return float64(d) / float64(time.Millisecond)
	}
	if d <= 0 {
		return math.Inf(1)
	}
	v := u.perSample / d.Seconds()
	if u.name == "MB/s" {
		v /= 1e6
	}
	return v
}

// format prints a median in the unit with three significant figures.
func (u unit) format(d time.Duration) string {
	if u.perSample == 0 {
		return sig3(u.value(d)) + " ms"
	}
	return sig3(u.value(d)) + " " + u.name
}

// spread prints the p10–p90 range of s in the unit (low to high value).
func (u unit) spread(s samples) string {
	if len(s) == 0 {
		return ""
	}
	a, b := u.value(s.percentile(10)), u.value(s.percentile(90))
	if a > b {
		a, b = b, a
	}
	return sig3(a) + "–" + sig3(b)
}

// ratio compares sidecar with another contender in the unit's own sense: time over time
// for a latency (below 1 is faster), throughput over throughput (above 1 is faster).
func (u unit) ratio(sidecar, other time.Duration) string {
	if sidecar <= 0 || other <= 0 {
		return "—"
	}
	if u.perSample == 0 {
		return ratioString(float64(sidecar) / float64(other))
	}
	return ratioString(float64(other) / float64(sidecar))
}

func ratioString(r float64) string { return sig3(r) + "×" }

// sig3 formats v with three significant figures, without exponent.
func sig3(v float64) string {
	switch a := math.Abs(v); {
	case math.IsInf(v, 0) || math.IsNaN(v):
		return "∞"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
