package config

import (
	"slices"
	"strings"
	"testing"
)

// TestApplyFileKeepsLastGood checks, without a watcher, which previous
// objects of a file survive a new version of it.
func TestApplyFileKeepsLastGood(t *testing.T) {
	const prev = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {ports: [{port: 5432}]}\n---\n" + endpointsYAML
	tests := []struct {
		name string
		next string
		want []string // delivered keys after the change, sorted
	}{
		{"everything removed", "", nil},
		{"web invalid keeps web", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 0}]}\n",
			[]string{"Service default/web"}},
		{"endpoints invalid keeps its slices", strings.Replace(endpointsYAML, "10.1.0.1", "bad", 1),
			[]string{"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6"}},
		{"misspelt kind keeps all", "apiVersion: v1\nkind: Servce\nmetadata: {name: web}\nspec: {ports: [{port: 81}]}\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
		{"unreadable document keeps all", "apiVersion: v1\nkind: [\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
		{"unreadable document beside a new version", "apiVersion: v1\nkind: [\n---\n" +
			"apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {ports: [{port: 5433}]}\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
	}
	d := decoder{nodePorts: DefaultNodePortRange}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, errs := d.applyFile("f.yaml", []byte(prev), nil)
			if len(errs) > 0 || len(before.objects) != 4 {
				t.Fatalf("setup: %d objects, errors %v", len(before.objects), errs)
			}
			after, _ := d.applyFile("f.yaml", []byte(tc.next), before)
			var got []string
			for _, o := range after.objects {
				got = append(got, o.key.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
