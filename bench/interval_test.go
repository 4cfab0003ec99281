package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// intervalResamples is how many bootstrap resamples ratioIntervals draws.
const intervalResamples = 1000

// ratioIntervals returns 95 % bootstrap intervals of the p50 and p99
// ratios of ours to naive, each given by round (as many of each): round i
// of ours ran beside round i of naive, taking turns. Each resample draws
// rounds with replacement, the same rounds for both sides, then each drawn
// round's requests with replacement, on each side: a round's requests
// share calls and a moment of the machine, so rounds, not requests, are
// what repeats independently, and drawing both levels makes the interval,
// if anything, too wide. An interval that holds 1 says the run cannot tell
// the two apart at that percentile. The draws are seeded, so the same
// latencies give the same intervals.
func ratioIntervals(ours, naive [][]time.Duration) (p50, p99 [2]float64) {
	rng := rand.New(rand.NewPCG(1, 2))
	r50 := make([]float64, intervalResamples)
	r99 := make([]float64, intervalResamples)
	var a, b []time.Duration
	for i := range intervalResamples {
		a, b = a[:0], b[:0]
		for range ours {
			r := rng.IntN(len(ours))
			a = resampleInto(a, ours[r], rng)
			b = resampleInto(b, naive[r], rng)
		}
		slices.Sort(a)
		slices.Sort(b)
		r50[i] = float64(sortedPercentile(a, 0.50)) / float64(sortedPercentile(b, 0.50))
		r99[i] = float64(sortedPercentile(a, 0.99)) / float64(sortedPercentile(b, 0.99))
	}
	return interval95(r50), interval95(r99)
}

// resampleInto appends len(from) draws, with replacement, of from to dst.
func resampleInto(dst, from []time.Duration, rng *rand.Rand) []time.Duration {
	for range from {
		dst = append(dst, from[rng.IntN(len(from))])
	}
	return dst
}

// interval95 returns the 2.5th and 97.5th percentiles of v, sorting it.
func interval95(v []float64) [2]float64 {
	slices.Sort(v)
	return [2]float64{sortedPercentile(v, 0.025), sortedPercentile(v, 0.975)}
}

// TestRatioIntervals: the interval holds 1 for two samplings of one
// distribution and the true ratio, excluding 1, for a side 5 % slower; and
// rounds whose p50s move from round to round, on each side by itself, give
// a wider interval than steady rounds.
func TestRatioIntervals(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	draw := func(base time.Duration, scale float64) []time.Duration {
		d := make([]time.Duration, 200)
		for i := range d {
			d[i] = time.Duration(scale * float64(base+time.Duration(rng.IntN(int(10*time.Millisecond)))))
		}
		return d
	}
	rounds := func(scale float64, drift bool) [][]time.Duration {
		var out [][]time.Duration
		for range 12 {
			base := 100 * time.Millisecond
			if drift { // each round of each side has its own offset
				base += time.Duration(rng.IntN(int(10 * time.Millisecond)))
			}
			out = append(out, draw(base, scale))
		}
		return out
	}
	holds := func(iv [2]float64, v float64) bool { return iv[0] <= v && v <= iv[1] }

	same50, same99 := ratioIntervals(rounds(1, false), rounds(1, false))
	if !holds(same50, 1) || !holds(same99, 1) {
		t.Errorf("one distribution on both sides: p50 interval %v, p99 %v; want both to hold 1", same50, same99)
	}
	slow50, _ := ratioIntervals(rounds(1.05, false), rounds(1, false))
	if holds(slow50, 1) || !holds(slow50, 1.05) {
		t.Errorf("one side 5 %% slower: p50 interval %v; want it to hold 1.05 and not 1", slow50)
	}
	drifting, _ := ratioIntervals(rounds(1, true), rounds(1, true))
	if drifting[1]-drifting[0] <= same50[1]-same50[0] {
		t.Errorf("rounds that drift: p50 interval %v, no wider than steady rounds' %v", drifting, same50)
	}
}
