package faults

import (
	"errors"
	"testing"
)

// A JSON null attribute is one not given, as in Toxiproxy, whose decode
// leaves a field as it is on null: an update keeps the value, a new toxic
// (API or annotation) takes the type's default.
func TestNullAttributeIsNotGiven(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"lat","type":"latency","attributes":{"latency":100,"jitter":10}}`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		patch           string
		latency, jitter float64
	}{
		{`{"attributes":{"jitter":null}}`, 100, 10},
		{`{"attributes":{"Jitter":null,"latency":200}}`, 200, 10},
		{`{"attributes":null,"toxicity":0.5}`, 200, 10},
	} {
		got, err := tbl.UpdateToxic(p.Name(), "lat", []byte(tc.patch))
		if err != nil {
			t.Fatalf("update %s: %v", tc.patch, err)
		}
		if got.Attributes["latency"] != tc.latency || got.Attributes["jitter"] != tc.jitter {
			t.Errorf("update %s: attributes %v, want latency %v jitter %v", tc.patch, got.Attributes, tc.latency, tc.jitter)
		}
	}

	// On a new toxic, the default: loss's rate is 1, not 0.
	if tx := toxic(t, `{"type":"loss","attributes":{"rate":null}}`); tx.Attributes["rate"] != 1 {
		t.Errorf("loss with rate null: rate %v, want the default 1", tx.Attributes["rate"])
	}
	got, err := ParseAnnotation(`[{"type":"reorder","attributes":{"delay":null,"rate":0.5}}]`, []ServicePort{udpDNS})
	if err != nil {
		t.Fatal(err)
	}
	if a := got["dns"][0].Attributes; a["delay"] != 10 || a["rate"] != 0.5 {
		t.Errorf("declared reorder with delay null: %v, want delay's default 10", a)
	}

	// A misspelt attribute is refused, null or not.
	var fe *FieldError
	if _, err := tbl.UpdateToxic(p.Name(), "lat", []byte(`{"attributes":{"jiter":null}}`)); !errors.As(err, &fe) || fe.Field != "attributes.jiter" {
		t.Errorf("update with jiter null: %v, want attributes.jiter refused", err)
	}
	tx := Toxic{}
	if err := tx.UnmarshalJSON([]byte(`{"type":"latency","attributes":{"latncy":null}}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Normalize(); !errors.As(err, &fe) || fe.Field != "attributes.latncy" {
		t.Errorf("latency with latncy null: %v, want attributes.latncy refused", err)
	}
}
