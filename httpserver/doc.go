// Package httpserver builds every HTTP server the proxy runs (health,
// metrics, healthCheckNodePorts, the fault API) with the same limits, so
// none of them lets the outside hold descriptors or goroutines the data
// path needs: a header timeout (slowloris), read and write timeouts (none
// of our handlers streams), an idle timeout for keep-alive connections and
// a cap on open connections, beyond which a new client takes the place of
// the longest-idle keep-alive connection, else of the longest-reading one
// (headers unfinished), or waits in the kernel's listen backlog while
// every connection is serving a request, instead of holding a descriptor
// of ours.
package httpserver
