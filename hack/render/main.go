// Command render prints the rendered YAML of dpkit's deployment manifests:
// a kustomize directory (kustomize mode) or the Helm chart with optional
// values files (helm mode). It lives in its own module so that the main
// module does not depend on kustomize or Helm.
//
//	go run . kustomize ../../deploy/overlays/nvidia
//	go run . helm ../../deploy/helm/dpkit [-f values.yaml ...] [--set-yaml 'a: b']
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: render kustomize DIR | render helm CHART [-f VALUES]... [--namespace NS] [--release NAME]")
	}
	switch args[0] {
	case "kustomize":
		k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
		m, err := k.Run(filesys.MakeFsOnDisk(), args[1])
		if err != nil {
			return err
		}
		out, err := m.AsYaml()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	case "helm":
		return helm(args[1], args[2:])
	default:
		return fmt.Errorf("unknown mode %q; use kustomize or helm", args[0])
	}
}

func helm(chartDir string, args []string) error {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return err
	}
	values := map[string]interface{}{}
	namespace, release := "dpkit-system", "dpkit"
	for i := 0; i < len(args); i++ {
		if i+1 >= len(args) {
			return fmt.Errorf("%s needs a value", args[i])
		}
		switch args[i] {
		case "-f":
			b, err := os.ReadFile(args[i+1])
			if err != nil {
				return err
			}
			var v map[string]interface{}
			if err := yaml.Unmarshal(b, &v); err != nil {
				return fmt.Errorf("%s: %w", args[i+1], err)
			}
			values = chartutil.CoalesceTables(v, values)
		case "--namespace":
			namespace = args[i+1]
		case "--release":
			release = args[i+1]
		default:
			return fmt.Errorf("unknown flag %q", args[i])
		}
		i++
	}
	if err := chartutil.ProcessDependencies(ch, values); err != nil {
		return err
	}
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(caps.APIVersions, "monitoring.coreos.com/v1")
	vals, err := chartutil.ToRenderValues(ch, values, opts, caps)
	if err != nil {
		return err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		body := strings.TrimSpace(files[n])
		if body == "" || strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		fmt.Printf("---\n# Source: %s\n%s\n", n, body)
	}
	return nil
}
