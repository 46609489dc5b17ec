package soak

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// plot draws one panel per series: the samples as a polyline, the warm-up
// shaded, and the fitted line after warm-up dashed. Plain SVG, no library.
func plot(samples []sample, vs []verdict, warmup time.Duration) string {
	const (
		width, panelH = 900.0, 200.0
		left, right   = 70.0, 20.0
		top, bottom   = 30.0, 30.0
	)
	var b strings.Builder
	height := float64(len(vs)) * (panelH + top + bottom)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	var tMax float64
	for _, s := range samples {
		tMax = max(tMax, s.At.Minutes())
	}
	if tMax == 0 {
		tMax = 1
	}
	colors := []string{"#1f77b4", "#d62728", "#2ca02c"}
	for i, v := range vs {
		y0 := float64(i)*(panelH+top+bottom) + top
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range samples {
			lo, hi = min(lo, v.Get(s)), max(hi, v.Get(s))
		}
		if len(samples) == 0 {
			lo, hi = 0, 1
		}
		pad := max((hi-lo)*0.1, math.Max(1, math.Abs(hi)*0.02))
		lo, hi = math.Max(0, lo-pad), hi+pad
		x := func(m float64) float64 { return left + m/tMax*(width-left-right) }
		y := func(val float64) float64 { return y0 + panelH - (val-lo)/(hi-lo)*panelH }
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-weight="bold">%s (%s): slope after warm-up %+.2f/min (tolerance %.2f)</text>`+"\n",
			left, y0-10, v.Name, v.Unit, v.perMin, v.Tolerance)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eeeeee"/>`+"\n", left, y0, x(warmup.Minutes())-left, panelH)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="black"/>`+"\n", left, y0, width-left-right, panelH)
		for k := 0; k <= 4; k++ {
			val := lo + (hi-lo)*float64(k)/4
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-5, y(val)+4, val)
		}
		step := niceStep(tMax)
		for m := 0.0; m <= tMax+1e-9; m += step {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g min</text>`+"\n", x(m), y0+panelH+18, m)
		}
		var pts []string
		for _, s := range samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.At.Minutes()), y(v.Get(s))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[i%len(colors)], strings.Join(pts, " "))
		if slope, at0, n := fit(samples, v.Get, warmup); n >= 3 {
			m0 := warmup.Minutes()
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-dasharray="6,4"/>`+"\n",
				x(m0), y(at0+slope*m0), x(tMax), y(at0+slope*tMax))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep is a tick spacing in minutes giving 4-10 ticks.
func niceStep(span float64) float64 {
	for _, s := range []float64{0.25, 0.5, 1, 2, 5, 10, 15, 30, 60} {
		if span/s <= 10 {
			return s
		}
	}
	return 120
}
