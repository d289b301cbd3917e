package extresource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		file    string
		wantErr []string
		check   func(t *testing.T, er *ExtendedResources)
	}{
		{
			name: "full",
			file: "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/dongle\n  quantity: 4\n- name: example.com/lic\n  quantity: \"2k\"\nallocatable: false\nresyncPeriod: 30s\n",
			check: func(t *testing.T, er *ExtendedResources) {
				l := er.List()
				if q := l["example.com/dongle"]; q.Value() != 4 {
					t.Errorf("dongle = %s", q.String())
				}
				if q := l["example.com/lic"]; q.Value() != 2000 {
					t.Errorf("lic = %s", q.String())
				}
				if *er.Allocatable || er.ResyncPeriod.Duration != 30*time.Second {
					t.Errorf("allocatable %v resync %v", *er.Allocatable, er.ResyncPeriod)
				}
			},
		},
		{
			name: "defaults",
			file: "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/dongle\n",
			check: func(t *testing.T, er *ExtendedResources) {
				if q := er.List()["example.com/dongle"]; q.Value() != 1 {
					t.Errorf("default quantity = %s, want 1", q.String())
				}
				if !*er.Allocatable || er.ResyncPeriod.Duration != DefaultResyncPeriod {
					t.Errorf("allocatable %v resync %v", *er.Allocatable, er.ResyncPeriod)
				}
			},
		},
		{
			name:    "unknown field",
			file:    "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/dongle\n  qty: 4\n",
			wantErr: []string{"resources[0].qty: Not found: unknown field; known fields: name, quantity"},
		},
		{
			name:    "wrong case",
			file:    "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- Name: example.com/dongle\n  quantity: 4\n",
			wantErr: []string{`resources[0].Name: Not found: unknown field; did you mean "name"? (field names are case-sensitive)`},
		},
		{
			name:    "duplicate key",
			file:    "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nkind: ExtendedResources\n",
			wantErr: []string{"kind: Duplicate value"},
		},
		{
			// The wording every dpkit configuration file shares
			// (pkg/configfile), checked before the rest of the file.
			name: "wrong apiVersion and kind",
			file: "apiVersion: dpkit.io/v1\nkind: Resources\nresources:\n- name: dongle\n",
			wantErr: []string{
				"2 problem(s)",
				`apiVersion: Unsupported value: "dpkit.io/v1": supported values: "dpkit.io/v1alpha1"`,
				`kind: Unsupported value: "Resources": supported values: "ExtendedResources"`,
			},
		},
		{
			name: "every problem with its path",
			file: "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresyncPeriod: -1s\nresources:\n- name: dongle\n- name: example.com/x\n  quantity: -2\n- name: example.com/x\n  quantity: 0.5\n",
			wantErr: []string{
				"resyncPeriod", "resources[0].name", "resources[1].quantity", "resources[2].quantity", "resources[2].name: Duplicate",
			},
		},
		{
			name:    "not yaml",
			file:    "resources: [",
			wantErr: []string{"not valid YAML or JSON"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "resources.yaml")
			if err := os.WriteFile(path, []byte(tt.file), 0o644); err != nil {
				t.Fatal(err)
			}
			er, err := Load(path)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Load = %+v, want an error", er)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, er)
		})
	}
}

func TestExampleFiles(t *testing.T) {
	t.Parallel()
	er, err := Load(filepath.Join("..", "..", "examples", "resources.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(er.Resources) == 0 {
		t.Fatal("examples/resources.yaml declares no resources")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/dongle\n  quantity: 4\n"))
	f.Add([]byte("resources: [{name: a, quantity: 1e3}]"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		er, err := Decode(data)
		if err != nil {
			return
		}
		// A valid file gives valid names and whole, non-negative amounts.
		for n, q := range er.List() {
			if errs := ValidateName(string(n), nil); len(errs) > 0 {
				t.Fatalf("valid file with invalid name %q", n)
			}
			if q.Sign() < 0 || q.MilliValue()%1000 != 0 {
				t.Fatalf("valid file with amount %s", q.String())
			}
		}
	})
}
