package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// repinAccesses is how many accesses the seed made after the deletion.
const repinAccesses = 5

// pinnedBackendDeleted is the seed's last experiment: with the default
// timeout (10800 s) cli1 is pinned; its backend is deleted (the
// EndpointSlice manifest is rewritten without it); cli1's next accesses must
// all land on one survivor, and cli1 must be pinned there again.
func (l *lab) pinnedBackendDeleted(ctx context.Context) (row, []string) {
	res := row{
		Experiment: "pinned backend deleted: 5 accesses",
		Seed:       "5× qzvtf (a survivor); pinned again",
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
	notes = append(notes, fmt.Sprintf("timeoutSeconds back to the default 10800 (manifest rewritten): applied after %s", round(took)))

	addr, err := l.proxyAddr(stickyServicePort)
	if err != nil {
		return fail(err)
	}
	before, err := accessMany(ctx, addr, cli1, 2)
	if err != nil {
		return fail(err)
	}
	if before[0] != before[1] {
		return fail(fmt.Errorf("cli1 is not pinned: %s then %s", before[0], before[1]))
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
	notes = append(notes, fmt.Sprintf("cli1 was pinned to %s; its EndpointSlice removed from the manifest: gone from the proxier after %s", pinned, round(took)))

	after, err := accessMany(ctx, addr, cli1, repinAccesses)
	if err != nil {
		return fail(err)
	}
	counts, _ := tally(after)
	repinned, ok := l.pinnedTo(stickyServicePort, cli1)
	ok = ok && repinned == after[0]
	again := "no"
	if ok {
		again = "yes"
	}
	res.Ours = fmt.Sprintf("%d× %s (was %s); pinned again: %s", counts[0], after[0], pinned, again)
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
