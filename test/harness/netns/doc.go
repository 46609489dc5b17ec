// Package netns builds throw-away Linux network labs for tests: named network
// namespaces with a random suffix, veth links between them, processes started
// inside them, and sockets opened inside them from the test process itself.
//
// Everything a Lab creates is registered with t.Cleanup when it is created, so
// it is removed at the end of the test even when the test fails: processes are
// killed by PID first, then the namespaces (and with them every veth, address,
// route and netfilter rule inside them) are deleted; a test binary stopped by
// SIGINT or SIGTERM deletes its namespaces before it exits. Tests only ever talk to
// addresses inside namespaces they created.
//
// The package needs root and the `ip` tool; Require skips a test cleanly when
// they are missing.
package netns
