package iptables

import (
	"errors"
	"strings"
	"testing"
)

// A family is present when its nat and filter tables answer; a kernel
// without one of them, or an iptables that fails, is not.
func TestPresent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(f *FakeRunner)
		want    string // in the error; "" = present
	}{
		{"both tables", func(*FakeRunner) {}, ""},
		{"no nat table", func(f *FakeRunner) { f.RemoveTable(TableNAT) }, "IPv6 nat table"},
		{"no filter table", func(f *FakeRunner) { f.RemoveTable(TableFilter) }, "IPv6 filter table"},
		{"iptables fails", func(f *FakeRunner) { f.SetError("ChainExists", errors.New("exit status 4")) }, "exit status 4"},
		// A built-in chain holding a rule only nft decodes (nft add rule ip
		// nat POSTROUTING oifname eth0 masquerade): iptables -S cannot list
		// it and iptables-save prints the table as incompatible, but the
		// table is there and can hold our chains.
		{"nat table iptables cannot print", func(f *FakeRunner) {
			f.Unprintable = map[Table]bool{TableNAT: true}
			f.Incompatible = map[string]bool{"nat/POSTROUTING": true}
		}, ""},
		{"filter table iptables cannot print", func(f *FakeRunner) {
			f.Unprintable = map[Table]bool{TableFilter: true}
			f.Incompatible = map[string]bool{"filter/INPUT": true}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFakeRunner(IPv6)
			tc.prepare(f)
			err := Present(f)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Present = %v, want %q", err, tc.want)
			}
		})
	}
}

// A held xtables lock is told apart from a family iptables cannot serve:
// the start-up probe and --cleanup take only the latter as "no IPv6".
func TestIsLockHeld(t *testing.T) {
	f := NewFakeRunner(IPv6)
	f.SetError("ChainExists", errors.New("running [ip6tables -t nat -S POSTROUTING 1 --wait 5]: exit status 4: Another app is currently holding the xtables lock. Stopped waiting after 5s."))
	if err := Present(f); !IsLockHeld(err) {
		t.Errorf("Present under a held lock = %v, not IsLockHeld", err)
	}
	f.SetError("ChainExists", nil)
	f.RemoveTable(TableNAT)
	if err := Present(f); err == nil || IsLockHeld(err) {
		t.Errorf("Present without a nat table = %v, want an error that is not IsLockHeld", err)
	}
}
