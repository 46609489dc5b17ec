package iptables

import (
	"maps"
	"testing"
)

func TestLeftoverPortals(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	if got, err := LeftoverPortals(fake); err != nil || len(got) != 0 {
		t.Fatalf("on an empty table: %v, %v; want none", got, err)
	}
	r := New(fake, testConfig)
	syncOK(t, r, webPortals())
	got, err := LeftoverPortals(fake)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, c := range ownedChains {
		if n := len(fake.Rules(c.table, c.name)); c.table == TableNAT && n > 0 {
			want[c.name] = n
		}
	}
	if len(want) == 0 || !maps.Equal(got, want) {
		t.Errorf("after a sync: %v, want %v", got, want)
	}
	if err := Cleanup(fake); err != nil {
		t.Fatal(err)
	}
	if got, err := LeftoverPortals(fake); err != nil || len(got) != 0 {
		t.Errorf("after --cleanup: %v, %v; want none", got, err)
	}
}
