package faults

import "net/netip"

// Applied names the toxics drawn for this connection at accept, in the
// order they act; nil when none applies (a connection tracked only so the
// API can cut it). /debug/connections shows it.
func (c *Conn) Applied() []string {
	if c == nil {
		return nil
	}
	return c.applied
}

// DatagramToxics names the toxics in force on the port that can act on
// client's datagrams. UDP draws per datagram, so this is what may apply,
// not what a given datagram got.
func (p *Port) DatagramToxics(client netip.Addr) []string {
	s := p.snap.Load()
	var out []string
	for _, t := range s.toxics {
		if t.actsOnDatagrams() && t.matches(client) {
			out = append(out, t.Name)
		}
	}
	return out
}
