package faults

import (
	"errors"
	"testing"
)

// noop is Toxiproxy's toxic that does nothing (toxics/noop.go): suites and
// client tests add it as a placeholder, so it is accepted wherever a toxic
// is, listed like any, and acts on nothing: a connection that draws it
// stays on the fault-free path, and a UDP port with only noop has no
// datagram plan.
func TestNoopDoesNothing(t *testing.T) {
	got, err := ParseAnnotation(`[{"type":"noop"}]`, []ServicePort{tcpHTTP, udpDNS})
	if err != nil {
		t.Fatalf("ParseAnnotation(noop): %v", err)
	}
	if s := summary(got); s != "http:noop_downstream/noop/downstream/1 dns:noop_downstream/noop/downstream/1" {
		t.Errorf("noop declared as %s", s)
	}

	_, tcp := declared(t, 0, 0, "TCP", `{"type":"noop"}`)
	if c := tcp.Accept(client1); c != nil {
		t.Errorf("a connection that drew noop is faulted: %v", c.Applied())
	}
	// Nor do its connections' numbers decide anything: the event loops
	// need not accept the port's clients one at a time for it.
	if tcp.InOrder() {
		t.Error("a port whose only toxic is noop asks for accept order")
	}
	if n := len(tcp.Info().Toxics); n != 1 {
		t.Errorf("noop listed %d times, want once", n)
	}
	// Beside a toxic that acts (here one never drawn), noop still
	// applies nothing.
	_, beside := declared(t, 0, 0, "TCP", `{"type":"noop"}`, `{"type":"latency","toxicity":0,"attributes":{"latency":1}}`)
	if c := beside.Accept(client1); c != nil {
		t.Errorf("a connection that drew noop beside an undrawn latency is faulted: %v", c.Applied())
	}
	_, udp := declared(t, 0, 0, "UDP", `{"type":"noop"}`)
	if udp.Datagrams() != nil {
		t.Error("a UDP port with only noop has a datagram plan")
	}

	// Like down and refuse, it has no attributes to set.
	tx := Toxic{Type: "noop", Toxicity: 1, Attributes: map[string]float64{"latency": 1}}
	var fe *FieldError
	if err := tx.Normalize(); !errors.As(err, &fe) || fe.Field != "attributes.latency" {
		t.Errorf("noop with an attribute: %v, want attributes.latency refused", err)
	}
}
