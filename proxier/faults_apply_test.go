package proxier

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func annotated(value string) svcOpt {
	return func(s *v1.Service) { s.Annotations = map[string]string{"kube-userspace-proxy/faults": value} }
}

func declaredToxics(t *testing.T, p *Proxier, proxy string) []string {
	t.Helper()
	info, err := p.opts.Faults.Proxy(proxy)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tx := range info.Toxics {
		names = append(names, tx.Name+"/"+tx.Origin)
	}
	return names
}

// A changed faults annotation reaches an open port at once, without a
// sync (toxics are not rules: they need not wait for min-sync-period); an
// invalid one leaves the last valid toxics in force, through syncs too.
func TestFaultAnnotationAppliesWithoutSync(t *testing.T) {
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	const proxy = "default.web.p"
	if got := declaredToxics(t, p, proxy); len(got) != 0 {
		t.Fatalf("toxics before any annotation: %v", got)
	}

	steps := []struct {
		annotation string // "" = none
		want       []string
	}{
		{`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`, []string{"slow/annotation"}},
		{`[{"name":"cut","type":"reset_peer"}]`, []string{"cut/annotation"}},
		{`[{"name":"bad","type":"explode"}]`, []string{"cut/annotation"}},
		{"", nil},
	}
	for _, step := range steps {
		svc := makeService("web")
		if step.annotation != "" {
			svc = makeService("web", annotated(step.annotation))
		}
		p.OnServiceUpdate(nil, svc)
		got := declaredToxics(t, p, proxy)
		if len(got) != len(step.want) || (len(got) > 0 && got[0] != step.want[0]) {
			t.Fatalf("annotation %q: toxics %v before any sync, want %v", step.annotation, got, step.want)
		}
		p.Sync()
		if after := declaredToxics(t, p, proxy); len(after) != len(got) || (len(got) > 0 && after[0] != got[0]) {
			t.Fatalf("annotation %q: a sync changed toxics %v to %v", step.annotation, got, after)
		}
	}
}
