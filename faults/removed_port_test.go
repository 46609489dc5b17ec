package faults

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// An API call looks its port up under the table's lock and changes it
// under the port's: a Service deleted in between (RemovePort, which forgets
// the port's series) must not have its series brought back by the change,
// since no port owns them any more and nothing would ever delete them.
// Each of the port's own methods below is what Table.AddToxic, SetEnabled,
// UpdateToxic, RemoveToxic and Reset call once the lookup returned.
func TestRemovedPortGetsNoSeriesBack(t *testing.T) {
	const name, label = "ns.web.http", "ns/web:http"
	for _, tc := range []struct {
		what   string
		change func(p *Port) error
	}{
		{"add toxic", func(p *Port) error {
			return p.addAPI(toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`))
		}},
		{"update toxic", func(p *Port) error {
			_, err := p.updateAPI("cut", []byte(`{"toxicity":0.5}`))
			return err
		}},
		{"remove toxic", func(p *Port) error { return p.removeAPI("cut") }},
		{"disable", func(p *Port) error { return p.setEnabled(false) }},
		{"reset", func(p *Port) error { return p.reset() }},
		{"declare", func(p *Port) error {
			p.SetDeclared([]Toxic{toxic(t, `{"name":"decl","type":"latency","attributes":{"latency":1}}`)})
			return nil
		}},
		{"relabel", func(p *Port) error { p.SetLabel("ns/other:http"); return nil }},
	} {
		t.Run(tc.what, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			tbl := NewTable(0, 0, NewMetrics(reg))
			p := tbl.PortLabeled(name, "TCP", label)
			if _, err := tbl.AddToxic(name, toxic(t, `{"name":"cut","type":"reset_peer"}`)); err != nil {
				t.Fatal(err)
			}
			tbl.RemovePort(name)
			err := tc.change(p)
			if err != nil && !errors.Is(err, ErrProxyNotFound) {
				t.Errorf("%s on a removed port: %v, want nil or ErrProxyNotFound", tc.what, err)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == "service_port" {
							t.Errorf("%s after the port was removed left %s{service_port=%q}", tc.what, mf.GetName(), lp.GetValue())
						}
					}
				}
			}
		})
	}
}
