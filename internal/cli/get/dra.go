package get

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/natural"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// draQuery is one "get claims" or "get slices".
type draQuery struct {
	kind, format, namespace string
	names                   []string
	// api reads from the API server; nil without --kubeconfig.
	api cli.DRAReader
	// prSocket is the node's PodResources API; nodeNamed says the user
	// named the node (--root or --pod-resources-socket), so that claims
	// read from the API server are marked prepared where it lists them.
	prSocket  string
	nodeNamed bool
}

// runDRA writes the claims or slices q asks for to env.Out.
func runDRA(ctx context.Context, env *cli.Env, q draQuery) error {
	ctx, cancel := context.WithTimeout(ctx, podsTimeout)
	defer cancel()
	if q.kind == "slices" {
		ss, err := q.api.Slices(ctx)
		if err != nil {
			return err
		}
		sortSlices(ss)
		ss, missing := filter(ss, q.names, func(s cli.Slice) string { return s.Name })
		return show(env, q.format, orEmpty(ss), len(ss), func(t *tabwriter.Writer) { writeSlices(t, ss) }, "ResourceSlice", missing)
	}
	var claims []cli.Claim
	if q.api != nil {
		var err error
		if claims, err = q.api.Claims(ctx, q.namespace); err != nil {
			return err
		}
	}
	if q.api == nil || q.nodeNamed {
		prepared, err := preparedClaims(ctx, q.prSocket)
		if err != nil {
			return err
		}
		claims = mergePrepared(claims, prepared, q.api == nil)
	}
	sortClaims(claims)
	claims, missing := selectClaims(claims, q.namespace, q.names)
	return show(env, q.format, claims, len(claims), func(t *tabwriter.Writer) { writeClaims(t, claims) }, "claim", missing)
}

// preparedClaims lists the claims the PodResources API at socket says the
// node prepared, each with the pods that use it and its devices' CDI IDs.
func preparedClaims(ctx context.Context, socket string) ([]cli.Claim, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("PodResources API at %s: %w (is dpkit kubelet, dpkit up, dpkit node or a kubelet running with this --root?)", socket, err)
	}
	client, closer, err := prclient.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	resp, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("PodResources List at %s: %w", socket, err)
	}
	return claimsFromList(resp), nil
}

// claimsFromList gathers the dynamic resources of every container of
// resp by claim.
func claimsFromList(resp *podresourcesv1.ListPodResourcesResponse) []cli.Claim {
	byKey := map[string]*cli.Claim{}
	var order []string
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				key := dr.GetClaimNamespace() + "/" + dr.GetClaimName()
				cl := byKey[key]
				if cl == nil {
					cl = &cli.Claim{Namespace: dr.GetClaimNamespace(), Name: dr.GetClaimName(), State: cli.ClaimPrepared}
					byKey[key] = cl
					order = append(order, key)
				}
				if !slices.Contains(cl.ReservedFor, p.GetName()) {
					cl.ReservedFor = append(cl.ReservedFor, p.GetName())
				}
				for _, r := range dr.GetClaimResources() {
					d := cli.ClaimDevice{Driver: r.GetDriverName(), Pool: r.GetPoolName(), Device: r.GetDeviceName(), ShareID: r.GetShareId()}
					for _, cdi := range r.GetCdiDevices() {
						d.CDIDeviceIDs = append(d.CDIDeviceIDs, cdi.GetName())
					}
					if !slices.ContainsFunc(cl.Devices, func(o cli.ClaimDevice) bool { return sameDevice(o, d) }) {
						cl.Devices = append(cl.Devices, d)
					}
				}
			}
		}
	}
	out := make([]cli.Claim, 0, len(order))
	for _, k := range order {
		natural.Sort(byKey[k].ReservedFor)
		out = append(out, *byKey[k])
	}
	return out
}

func sameDevice(a, b cli.ClaimDevice) bool {
	return a.Driver == b.Driver && a.Pool == b.Pool && a.Device == b.Device && a.ShareID == b.ShareID
}

// mergePrepared marks the claims the node prepared and gives their
// devices the CDI IDs it has. A prepared claim the API server does not
// list is shown as the node has it when add is set (there is no API
// server), otherwise left out: the node holds a claim deleted since.
func mergePrepared(claims, prepared []cli.Claim, add bool) []cli.Claim {
	for _, p := range prepared {
		i := slices.IndexFunc(claims, func(c cli.Claim) bool { return c.Namespace == p.Namespace && c.Name == p.Name })
		if i < 0 {
			if add {
				claims = append(claims, p)
			}
			continue
		}
		c := &claims[i]
		c.State = cli.ClaimPrepared
		for j := range c.Devices {
			for _, d := range p.Devices {
				if sameDevice(c.Devices[j], d) {
					c.Devices[j].CDIDeviceIDs = d.CDIDeviceIDs
				}
			}
		}
	}
	return claims
}

// selectClaims keeps the claims of namespace (all when empty) that names
// names, by name or NAMESPACE/NAME (all when names is empty), and returns
// the names no claim has.
func selectClaims(claims []cli.Claim, namespace string, names []string) ([]cli.Claim, []string) {
	kept := []cli.Claim{}
	found := map[string]bool{}
	for _, c := range claims {
		if namespace != "" && c.Namespace != namespace {
			continue
		}
		match := len(names) == 0
		for _, n := range names {
			if n == c.Name || n == c.Namespace+"/"+c.Name {
				match, found[n] = true, true
			}
		}
		if match {
			kept = append(kept, c)
		}
	}
	var missing []string
	for _, n := range names {
		if !found[n] && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	return kept, missing
}

func sortClaims(cs []cli.Claim) {
	slices.SortFunc(cs, func(a, b cli.Claim) int {
		return cmp.Or(natural.Compare(a.Namespace, b.Namespace), natural.Compare(a.Name, b.Name))
	})
}

func sortSlices(ss []cli.Slice) {
	slices.SortFunc(ss, func(a, b cli.Slice) int {
		return cmp.Or(natural.Compare(a.Node, b.Node), strings.Compare(a.Driver, b.Driver),
			natural.Compare(a.Pool, b.Pool), natural.Compare(a.Name, b.Name))
	})
}

// writeClaims writes the table of claims: devices as driver/pool/device.
func writeClaims(t io.Writer, cs []cli.Claim) {
	fmt.Fprintln(t, "NAMESPACE\tNAME\tSTATE\tNODE\tDEVICES\tRESERVED FOR")
	for _, c := range cs {
		devs := make([]string, len(c.Devices))
		for i, d := range c.Devices {
			devs[i] = d.Driver + "/" + d.Pool + "/" + output.ID(d.Device)
			if d.ShareID != "" {
				devs[i] += "[share " + output.ID(d.ShareID)
				for _, k := range slices.Sorted(maps.Keys(d.Consumed)) {
					devs[i] += " " + k[strings.LastIndex(k, "/")+1:] + "=" + d.Consumed[k]
				}
				devs[i] += "]"
			}
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Namespace, c.Name, c.State, orDash(c.Node),
			orDash(strings.Join(devs, ",")), orDash(strings.Join(c.ReservedFor, ",")))
	}
}

// writeSlices writes the table of slices.
func writeSlices(t io.Writer, ss []cli.Slice) {
	fmt.Fprintln(t, "NAME\tNODE\tDRIVER\tPOOL\tGENERATION\tCOUNT\tDEVICES")
	for _, s := range ss {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Name, orDash(s.Node), s.Driver, s.Pool, s.Generation, len(s.Devices), orDash(output.IDs(s.Devices)))
	}
}
