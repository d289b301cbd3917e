package devicemanager

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// TestCheckpointHoldsEveryReturnedChange removes pods from many goroutines
// at once, so writes wait on each other and are shared (group commit): when
// RemovePod returns, the file on disk must already leave its pod out, and
// the last file must match the state exactly.
func TestCheckpointHoldsEveryReturnedChange(t *testing.T) {
	t.Parallel()
	m, _ := benchManager(t, 64, "none", true)
	var uids []types.UID
	for i := range 48 {
		p := makePod(fmt.Sprint("p", i), c("app", 1))
		if _, err := m.Admit(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		uids = append(uids, p.UID)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(uids))
	for _, uid := range uids[:40] {
		wg.Go(func() {
			m.RemovePod(uid)
			cp, err := checkpoint.Read(m.CheckpointPath())
			if err != nil {
				errs <- err
				return
			}
			for _, e := range cp.Entries {
				if e.PodUID == string(uid) {
					errs <- fmt.Errorf("RemovePod(%s) returned, and the checkpoint still holds the pod", uid)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	cp, err := checkpoint.Read(m.CheckpointPath())
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, e := range cp.Entries {
		held[e.PodUID] = true
	}
	for i, uid := range uids {
		if held[string(uid)] != (i >= 40) {
			t.Errorf("pod %s in the last checkpoint = %v, want %v", uid, held[string(uid)], i >= 40)
		}
	}
	if len(cp.Registered[res]) != 64 {
		t.Errorf("registered %d devices, want 64", len(cp.Registered[res]))
	}
}
