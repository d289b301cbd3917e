package draplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// CheckpointFile is the checkpoint's name in <PluginsDir>/<DriverName>.
const CheckpointFile = "checkpoint.json"

// preparedClaim is what the driver prepared for one claim: enough to
// answer the same again, to hold its devices after a restart and to write
// its CDI spec again, without calling the plugin's Allocate a second time.
type preparedClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// DeviceIDs are the inventory IDs the claim holds.
	DeviceIDs []string `json:"deviceIDs"`
	// Grants are what the claim holds of them: shares of shared devices
	// with their amounts. A checkpoint written before shares existed has
	// none; its claims hold DeviceIDs whole.
	Grants []inventory.Grant `json:"grants,omitempty"`
	// Devices is the answer to NodePrepareResources.
	Devices []preparedDevice `json:"devices"`
	// Spec is the claim's CDI spec.
	Spec *cdispec.Spec `json:"spec"`
}

type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// ShareID is the share of a shared device the claim was allocated.
	ShareID string `json:"shareID,omitempty"`
}

// grants returns what the claim holds in the arbiter.
func (p *preparedClaim) grants() []inventory.Grant {
	if len(p.Grants) > 0 {
		return p.Grants
	}
	gs := make([]inventory.Grant, len(p.DeviceIDs))
	for i, id := range p.DeviceIDs {
		gs[i] = inventory.Grant{Device: id}
	}
	return gs
}

func (p *preparedClaim) result() kubeletplugin.PrepareResult {
	out := kubeletplugin.PrepareResult{Devices: make([]kubeletplugin.Device, 0, len(p.Devices))}
	for _, dev := range p.Devices {
		kd := kubeletplugin.Device{
			Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: dev.CDIDeviceIDs,
		}
		if dev.ShareID != "" {
			kd.ShareID = new(types.UID(dev.ShareID))
		}
		out.Devices = append(out.Devices, kd)
	}
	return out
}

// checkpointFile is the file's form: Data is the JSON of the prepared
// claims and Checksum its CRC-32 (IEEE), as the kubelet's checkpoints.
type checkpointFile struct {
	Data     string `json:"data"`
	Checksum uint32 `json:"checksum"`
}

type checkpointData struct {
	Version string                    `json:"version"`
	Claims  map[string]*preparedClaim `json:"claims"`
}

const checkpointVersion = "dra.dpkit.io/v1"

func readCheckpoint(path string) (map[string]*preparedClaim, error) {
	blob, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]*preparedClaim{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the DRA driver checkpoint: %w", err)
	}
	corrupt := func(why string) error {
		return fmt.Errorf("DRA driver checkpoint %s is corrupt (%s): the claims it lists are not known; remove the file only once no pod on the node uses this driver's claims", path, why)
	}
	var f checkpointFile
	if err := json.Unmarshal(blob, &f); err != nil {
		return nil, corrupt(err.Error())
	}
	if crc32.ChecksumIEEE([]byte(f.Data)) != f.Checksum {
		return nil, corrupt("checksum mismatch")
	}
	var data checkpointData
	if err := json.Unmarshal([]byte(f.Data), &data); err != nil {
		return nil, corrupt(err.Error())
	}
	if data.Version != checkpointVersion {
		return nil, corrupt(fmt.Sprintf("version %q, want %q", data.Version, checkpointVersion))
	}
	if data.Claims == nil {
		data.Claims = map[string]*preparedClaim{}
	}
	return data.Claims, nil
}

func writeCheckpoint(path string, claims map[string]*preparedClaim) error {
	data, err := json.Marshal(checkpointData{Version: checkpointVersion, Claims: claims})
	if err != nil {
		return err
	}
	blob, err := json.Marshal(checkpointFile{Data: string(data), Checksum: crc32.ChecksumIEEE(data)})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("write the DRA driver checkpoint: %w", err)
	}
	if err := fileutil.WriteCheckpoint(path, blob, 0o600); err != nil {
		return fmt.Errorf("write the DRA driver checkpoint: %w", err)
	}
	return nil
}
