// Package soak owns the long-running proof of the data path (`make soak`):
// the real proxy binary, in network namespaces, under mixed TCP (new,
// kept-alive, long streams, half-closed) and UDP (a fresh source port per
// query) traffic through 50 Services whose endpoints churn every second,
// while some clients vanish without a FIN. TestSoak asserts that no
// connection with a live endpoint fails, that no byte is lost or corrupted,
// and that the proxy's RSS, descriptors and goroutines stay flat; it writes a
// table and an SVG plot of those samples.
//
// Everything lives in _test.go files; this file only carries the package
// documentation.
package soak
