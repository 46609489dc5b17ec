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
