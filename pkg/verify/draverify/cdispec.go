package draverify

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The CDI checks past dra.prepare.cdi, judged as the container runtimes
// judge the spec files: containerd and CRI-O resolve the CDI device IDs
// the kubelet hands them through the CDI library's cache
// (tags.cncf.io/container-device-interface pkg/cdi), which reads each
// *.json and *.yaml file of its directories with ReadSpec, leaves out a
// file that does not validate, and leaves out a fully qualified device
// that two files of one directory define.

// cdiFiles lists the spec files of dir as the CDI cache scans it.
func cdiFiles(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".json" || ext == ".yaml") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// validateSpecFiles reads every spec file of dir with the CDI library,
// as a runtime does, and lists the files it refuses and why.
func validateSpecFiles(dir string) (files int, problems []string) {
	for _, f := range cdiFiles(dir) {
		files++
		if _, err := cdi.ReadSpec(f, 0); err != nil {
			msg := strings.ReplaceAll(err.Error(), f, filepath.Base(f))
			problems = append(problems, fmt.Sprintf("%s: %s", filepath.Base(f), msg))
		}
	}
	return files, problems
}

// checkCDIValid judges dra.prepare.cdi-valid: every spec file the
// driver wrote for the prepared claims validates. Files that do not
// parse at all, or define none of the IDs, are dra.prepare.cdi's.
func (r *run) checkCDIValid() {
	if res := r.results[verify.CheckDRACDI]; res.Verdict != verify.Pass {
		r.set(verify.CheckDRACDIValid, verify.Skip, "see %s (%s)", verify.CheckDRACDI, res.Verdict)
		return
	}
	files, problems := validateSpecFiles(r.cdiDir)
	if len(problems) > 0 {
		r.set(verify.CheckDRACDIValid, verify.Fail, "the CDI library refuses %s: a container runtime leaves every device of such a file out, and a container that names one does not start", strings.Join(problems, "; "))
		return
	}
	r.set(verify.CheckDRACDIValid, verify.Pass, "the %d spec file(s) of the CDI directory, with claim-a and claim-b prepared, read and validated by the CDI library (cdi.ReadSpec)", files)
}

// cdiIndex is what a CDI directory defines: each fully qualified device
// and the files (base names) that define it. Files that do not parse
// define nothing.
type cdiIndex map[string][]string

func indexCDI(dir string) cdiIndex {
	idx := cdiIndex{}
	for _, f := range cdiFiles(dir) {
		spec, err := readSpec(f)
		if err != nil {
			continue
		}
		for _, d := range spec.Devices {
			id := spec.Kind + "=" + d.Name
			if !slices.Contains(idx[id], filepath.Base(f)) {
				idx[id] = append(idx[id], filepath.Base(f))
			}
		}
	}
	return idx
}

// unresolved lists the IDs of ids that idx defines in no file or in
// more than one, with how many.
func (idx cdiIndex) unresolved(ids []string) []string {
	var out []string
	for _, id := range ids {
		if n := len(idx[id]); n != 1 {
			out = append(out, fmt.Sprintf("%s (in %d spec files)", id, n))
		}
	}
	return out
}

// keys lists the devices idx defines.
func (idx cdiIndex) keys() []string { return slices.Sorted(maps.Keys(idx)) }

// conflicts lists the devices idx defines in more than one file.
func (idx cdiIndex) conflicts() []string {
	var out []string
	for id, files := range idx {
		if len(files) > 1 {
			out = append(out, fmt.Sprintf("%s in %s", id, strings.Join(files, " and ")))
		}
	}
	sort.Strings(out)
	return out
}

// cdiIDs lists the CDI device IDs of an answer.
func cdiIDs(res *drav1.NodePrepareResourceResponse) []string {
	var out []string
	for _, d := range res.GetDevices() {
		out = append(out, d.GetCdiDeviceIds()...)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// checkCDIUnique judges dra.prepare.cdi-unique: with claim-a and claim-b
// prepared, and then claim-admin on claim-a's device too, no device is
// in two spec files; once claim-admin is unprepared, what the directory
// defined before it was prepared is defined once again.
func (r *run) checkCDIUnique(ctx context.Context) {
	if res := r.results[verify.CheckDRACDI]; res.Verdict != verify.Pass {
		r.set(verify.CheckDRACDIUnique, verify.Skip, "see %s (%s)", verify.CheckDRACDI, res.Verdict)
		return
	}
	before := indexCDI(r.cdiDir)
	var problems []string
	what := "claim-a and claim-b prepared"
	if c := before.conflicts(); len(c) > 0 {
		problems = append(problems, fmt.Sprintf("with %s, %s", what, strings.Join(c, "; ")))
	}
	// What claim-a and claim-b were answered still resolves after
	// dra.prepare.shared-device prepared and unprepared other claims on
	// claim-a's device (unless the driver answers a claim prepared again
	// with new IDs: dra.prepare.idempotent's).
	if r.results[verify.CheckDRAIdempotent].Verdict == verify.Pass {
		for _, role := range []string{"claim-a", "claim-b"} {
			if c := r.claims[role]; c != nil && r.prepared[string(c.UID)] != nil {
				if lost := before.unresolved(cdiIDs(r.prepared[string(c.UID)])); len(lost) > 0 {
					problems = append(problems, fmt.Sprintf("%s, still prepared, was answered %s, after claims on device %s were prepared and unprepared beside it (%s)", role, strings.Join(lost, ", "), r.devices[0], verify.CheckDRASharedDevice))
				}
			}
		}
	}
	admin := r.claims["claim-admin"]
	shared := r.results[verify.CheckDRASharedDevice].Verdict
	switch {
	case len(problems) > 0:
	case admin == nil || (shared != verify.Pass && shared != verify.Warn):
		what += " (claim-admin not prepared again: see " + verify.CheckDRASharedDevice + ")"
	default:
		res, timedOut, err := r.prepareAlone(ctx, admin)
		switch {
		case timedOut:
			r.set(verify.CheckDRACDIUnique, verify.Skip, "see %s", verify.CheckDRATimeout)
			return
		case err != nil:
			what += fmt.Sprintf(" (claim-admin could not be prepared again: %v)", err)
		default:
			if c := r.conflicts(); len(c) > 0 {
				problems = append(problems, fmt.Sprintf("with claim-admin (%s) prepared beside claim-a on device %s, %s", strings.Join(cdiIDs(res), ", "), r.devices[0], strings.Join(c, "; ")))
			}
		}
		_, _ = r.unprepare(ctx, ref(admin))
		if err == nil && len(problems) == 0 {
			if lost := indexCDI(r.cdiDir).unresolved(before.keys()); len(lost) > 0 {
				problems = append(problems, fmt.Sprintf("once claim-admin was unprepared, what the directory defined before it was prepared is not defined once: %s: unpreparing one claim took the device from another", strings.Join(lost, ", ")))
			}
			what = "claim-a and claim-b prepared, then claim-admin beside claim-a on device " + r.devices[0] + " and unprepared again"
		}
	}
	if len(problems) > 0 {
		r.set(verify.CheckDRACDIUnique, verify.Fail, "%s: the CDI library of the container runtimes leaves out a device two spec files define, or none does, so that the container of the claim does not get it", strings.Join(problems, "; "))
		return
	}
	r.set(verify.CheckDRACDIUnique, verify.Pass, "%s: every one of the %d CDI device(s) in one spec file", what, len(before))
}

// conflicts lists the devices of the CDI directory in two spec files.
func (r *run) conflicts() []string { return indexCDI(r.cdiDir).conflicts() }
