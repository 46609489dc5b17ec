package proxier

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A /debug/services row with faults decodes back into the type that wrote
// it (the embedded Toxic's strict decoder refused "origin").
func TestDebugServicePortJSONRoundTrip(t *testing.T) {
	row := DebugServicePort{
		ServicePort: "default/web:http", Protocol: "TCP", Port: 80,
		FaultProxy: "default/web:http", FaultsEnabled: true,
		Faults: []DebugToxic{
			{Toxic: faults.Toxic{Name: "slow", Type: "latency", Stream: faults.Downstream, Toxicity: 1, Attributes: map[string]float64{"latency": 300}}, Origin: "annotation"},
			{Toxic: faults.Toxic{Name: "cut", Type: "reset_peer", Stream: faults.Upstream, Toxicity: 0.5, Attributes: map[string]float64{"timeout": 0}}, Origin: "api"},
		},
	}
	b, err := json.Marshal([]DebugServicePort{row})
	if err != nil {
		t.Fatal(err)
	}
	var got []DebugServicePort
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], row) {
		t.Fatalf("round trip changed the row:\n got %+v\nwant %+v", got, row)
	}
	// A misspelt toxic field is still refused, naming it.
	var d DebugToxic
	if err := json.Unmarshal([]byte(`{"name":"x","typo":1,"origin":"api"}`), &d); err == nil {
		t.Error("an unknown toxic field was accepted")
	}
}
