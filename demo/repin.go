package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// repinAccesses is how many connections the real cluster's measurement made
// after the deletion.
const repinAccesses = 5

// pinnedBackendDeleted is the last affinity experiment: with the default
// timeout (10800 s) client 1 is pinned; its backend is deleted (the
// EndpointSlice manifest is rewritten without it); client 1's next
// connections must all land on one survivor, and it must be pinned there
// again.
func (l *lab) pinnedBackendDeleted(ctx context.Context) (row, []string) {
	res := row{
		Experiment: "client 1's pod is deleted; client 1 connects 5 times",
		Expected:   "5/5 on one surviving pod, kept there",
	}
	fail := func(err error) (row, []string) {
		res.Ours = "error: " + err.Error()
		return res, nil
	}
	var notes []string
	took, err := l.setStickyTimeout(ctx, 0)
	if err != nil {
		return fail(err)
	}
	notes = append(notes, fmt.Sprintf("affinity timeout back to Kubernetes' default, 10800 s (3 hours), by editing the manifest: in force after %s", round(took)))

	addr, err := l.proxyAddr(stickyServicePort)
	if err != nil {
		return fail(err)
	}
	before, err := l.accessMany(ctx, addr, cli1, 2)
	if err != nil {
		return fail(err)
	}
	if before[0] != before[1] {
		return fail(fmt.Errorf("client 1 is not pinned: %s then %s", before[0], before[1]))
	}
	pinned := before[0]
	var survivors []*backend.Server
	for _, b := range l.backends {
		if b.Name != pinned {
			survivors = append(survivors, b)
		}
	}
	if took, err = l.setStickyBackends(ctx, survivors); err != nil {
		return fail(err)
	}
	notes = append(notes, fmt.Sprintf("client 1 was kept on %s; %s deleted from the Service's endpoints (the EndpointSlice manifest): the proxy stopped using it after %s", pinned, pinned, round(took)))

	after, err := l.accessMany(ctx, addr, cli1, repinAccesses)
	if err != nil {
		return fail(err)
	}
	counts, _ := tally(after)
	repinned, ok := l.pinnedTo(stickyServicePort, cli1)
	ok = ok && repinned == after[0]
	again := "NOT kept there"
	if ok {
		again = "kept there"
	}
	res.Ours = fmt.Sprintf("%d/%d on %s, %s", counts[0], repinAccesses, after[0], again)
	res.Matched = len(counts) == 1 && after[0] != pinned && ok
	return res, notes
}

// round shortens a duration for printing: 1.04s, 120ms.
func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
