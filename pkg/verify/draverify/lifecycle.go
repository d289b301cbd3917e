package draverify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/verify"
)

// The claims' life after their Prepare, as the kubelet ends it: an
// Unprepare once the ResourceClaim is gone (dra.unprepare.deleted-claim)
// and one after the driver restarted (dra.unprepare.after-restart).

func (r *run) checkLifecycle(ctx context.Context) bool {
	r.checkDeletedClaim(ctx)
	return r.checkUnprepareAfterRestart(ctx)
}

// prepareOne makes a claim on device and prepares it; it returns the
// claim and the CDI IDs its Prepare defined. A claim that cannot be made
// or prepared skips check id: the Prepare checks judge that.
func (r *run) prepareOne(ctx context.Context, id, role, device string) (*resourcev1.ResourceClaim, []string, bool) {
	claim, err := r.newClaim(ctx, role, device, false)
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return nil, nil, false
	}
	before := r.cdiDefined()
	resp, err := r.prepare(ctx, claim)
	if err == nil {
		if problems := preparedProblems(resp, []*resourcev1.ResourceClaim{claim}); len(problems) > 0 {
			err = errors.New(strings.Join(problems, "; "))
		}
	}
	if err != nil {
		r.forget(ctx, claim)
		r.set(id, verify.Skip, "%s could not be prepared (the Prepare checks judge that): %v", role, err)
		return nil, nil, false
	}
	return claim, r.cdiAdded(before, resp.Claims[string(claim.UID)]), true
}

// judgeUnprepare judges the Unprepare of claim that the kubelet makes
// in situation, and that the CDI IDs added by its Prepare are gone; it
// returns false when it decided check id.
func (r *run) judgeUnprepare(id string, claim *resourcev1.ResourceClaim, resp *drav1.NodeUnprepareResourcesResponse, err error, situation string, added []string) bool {
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
	case err != nil:
		r.set(id, verify.Fail, "NodeUnprepareResources of %s %s: %v", claim.Name, situation, err)
	case len(unpreparedProblems(resp, []*resourcev1.ResourceClaim{claim})) > 0:
		r.set(id, verify.Fail, "NodeUnprepareResources %s: %s", situation, strings.Join(unpreparedProblems(resp, []*resourcev1.ResourceClaim{claim}), "; "))
	case len(r.cdiLeft(added)) > 0:
		r.set(id, verify.Fail, "NodeUnprepareResources of %s %s succeeded, but its CDI spec still defines %s", claim.Name, situation, strings.Join(r.cdiLeft(added), ", "))
	default:
		return true
	}
	return false
}

// checkDeletedClaim deletes a prepared claim from the API server, then
// unprepares it by namespace, name and UID, as the kubelet does once a
// pod and its claim are gone.
func (r *run) checkDeletedClaim(ctx context.Context) {
	id := verify.CheckDRADeletedClaim
	if r.decided(id) {
		return
	}
	// The last device: a driver that cannot unprepare the claim holds
	// it, and the checks after this one use the first.
	claim, added, ok := r.prepareOne(ctx, id, "claim-deleted", r.devices[len(r.devices)-1])
	if !ok {
		return
	}
	defer r.forget(ctx, claim)
	if err := r.deleteClaim(ctx, claim); err != nil {
		r.set(id, verify.Skip, "%v", err)
		return
	}
	resp, err := r.unprepare(ctx, ref(claim))
	if !r.judgeUnprepare(id, claim, resp, err, "after its ResourceClaim was deleted", added) {
		return
	}
	if len(added) == 0 {
		r.set(id, verify.Skip, "see %s: no CDI spec was written for claim-deleted, so none could be removed; NodeUnprepareResources after the ResourceClaim was deleted succeeded", verify.CheckDRACDI)
		return
	}
	r.set(id, verify.Pass, "claim-deleted unprepared after its ResourceClaim was deleted; its CDI spec (%s) removed", strings.Join(added, ", "))
}

// deleteClaim deletes claim from the API server, its finalizers first,
// and waits until it is gone.
func (r *run) deleteClaim(ctx context.Context, claim *resourcev1.ResourceClaim) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	claims := r.client.ResourceV1().ResourceClaims(claim.Namespace)
	if len(claim.Finalizers) > 0 {
		patch := fmt.Appendf(nil, `{"metadata":{"finalizers":null,"resourceVersion":%q}}`, claim.ResourceVersion)
		if _, err := claims.Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("remove the finalizers of ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
	}
	err := claims.Delete(ctx, claim.Name, uidPrecondition(claim.UID))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && c.UID != claim.UID):
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("ResourceClaim %s/%s not gone within %s of its deletion", claim.Namespace, claim.Name, r.cfg.CallTimeout)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// restartDriver kills the driver without a chance to clean up, as a
// crash does, starts it again in the same pod and waits for its
// registration: the CDI directory stays (no reboot). It returns false
// after deciding check id and stopping the run when the driver does not
// come back.
func (r *run) restartDriver(ctx context.Context, id string) bool {
	_, _ = r.signalWait(syscall.SIGKILL, r.cfg.TermTimeout)
	r.drainRegistrations()
	proc, err := verifyproc.Start(r.command, r.env)
	if err != nil {
		r.set(id, verify.Fail, "could not start the driver again: %v", err)
		return r.stop("see " + id)
	}
	r.proc = proc
	reg, ok := r.waitRegistration(ctx, r.cfg.ReregisterThreshold)
	if !ok {
		if ctx.Err() != nil {
			return false
		}
		why := fmt.Sprintf("not registered again within %s after it was killed and started again", r.cfg.ReregisterThreshold)
		if r.proc.Exit() != "" {
			why = "the driver " + r.proc.Exit() + " after it was killed and started again"
			r.exitJudged = true
		}
		r.set(id, verify.Fail, "%s", why)
		return r.stop("see " + id)
	}
	return r.reconnect(reg)
}

// checkUnprepareAfterRestart prepares a claim, kills the driver and
// starts it again, then unprepares the claim twice, as a kubelet that
// restarted before recording the outcome does.
func (r *run) checkUnprepareAfterRestart(ctx context.Context) bool {
	id := verify.CheckDRAUnprepareRestart
	if r.decided(id) {
		return true
	}
	claim, added, ok := r.prepareOne(ctx, id, "claim-restart", r.devices[0])
	if !ok {
		return true
	}
	if !r.restartDriver(ctx, id) {
		return false
	}
	defer r.forget(ctx, claim)
	resp, err := r.unprepare(ctx, ref(claim))
	if !r.judgeUnprepare(id, claim, resp, err, "after the driver was killed and started again", added) {
		return true
	}
	again := "unprepared a second time"
	if r.results[verify.CheckDRAUnknownClaim].Verdict == verify.Fail {
		// One cause, one failure: a claim unprepared before is one the
		// driver does not know.
		again = "not unprepared a second time (see " + verify.CheckDRAUnknownClaim + ")"
	} else {
		resp, err = r.unprepare(ctx, ref(claim))
		if !r.judgeUnprepare(id, claim, resp, err, "a second time, after the driver restarted", nil) {
			return true
		}
	}
	if len(added) == 0 {
		r.set(id, verify.Skip, "see %s: no CDI spec was written for claim-restart, so none could be removed; NodeUnprepareResources after the driver's restart succeeded, and %s", verify.CheckDRACDI, again)
		return true
	}
	r.set(id, verify.Pass, "claim-restart, prepared before the driver was killed and started again, unprepared after it: its CDI spec (%s) removed; %s", strings.Join(added, ", "), again)
	return true
}
