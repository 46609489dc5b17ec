// Package backend owns the test backends: servers that answer every request
// with their own name, so that a test can tell which backend a proxied
// connection or datagram reached, and the client side of that protocol
// (AskTCP, AskUDP), through which the suites and test/tools/client ask them;
// and the benchmarks' servers, which do not name themselves (NewHTTPServer,
// EchoUDP).
//
// A Server runs in the test process (on sockets it is given, which may belong
// to a network namespace), as the test/tools/backend command, or as the
// demo's backends (Demo mode: HTTP/1.1 and a UDP echo). It never decides where it listens: callers
// open the sockets or name the address.
package backend
