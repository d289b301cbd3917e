// Package kubeconfig finds the API server client configuration of every
// dpkit command that talks to a cluster (node, advertise, get), in one
// order: the --kubeconfig flag, then $KUBECONFIG, then ~/.kube/config,
// then the in-cluster configuration of a pod's service account, the order
// kubectl uses.
package kubeconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Flag and EnvVar name where a kubeconfig path comes from.
const (
	Flag   = "--kubeconfig"
	EnvVar = "KUBECONFIG"
)

// TryHint says where a cluster to try dpkit on comes from, for the errors
// of commands that need one.
const TryHint = "for a cluster to try dpkit on, run bash hack/cluster.sh in a dpkit checkout (its first run builds Kubernetes from Go modules: about 6 minutes on 2 cores) and paste the exports it prints (docs/getting-started.md)"

// ErrNotFound is returned when no configuration is found anywhere.
var ErrNotFound = errors.New("no cluster configuration found")

// Load returns the client configuration from, in order: path (the value of
// --kubeconfig; empty when the flag was not given); the files $KUBECONFIG
// lists (separated by the OS's path list separator and merged as kubectl
// merges them); ~/.kube/config; the in-cluster configuration. Its error
// names --kubeconfig and $KUBECONFIG and says where it looked.
func Load(path string) (*rest.Config, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	env := os.Getenv(EnvVar)
	home := homeFile()
	if env != "" {
		rules.Precedence = filepath.SplitList(env)
	} else if home != "" {
		rules.Precedence = []string{home}
	}
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s %s: the file does not exist", Flag, path)
			}
			return nil, fmt.Errorf("%s %s: %w", Flag, path, err)
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case clientcmd.IsEmptyConfig(err):
		return nil, notFound(env, home)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", source(path, env, home), err)
	}
	return cfg, nil
}

// source names where a configuration that failed to load came from.
func source(path, env, home string) string {
	switch {
	case path != "":
		return Flag + " " + path
	case env != "":
		return "$" + EnvVar + "=" + env
	}
	return home
}

func notFound(env, home string) error {
	looked := []string{"$" + EnvVar + " is not set"}
	if env != "" {
		looked[0] = "$" + EnvVar + "=" + env + " names no file that exists"
	} else if home != "" {
		looked = append(looked, home+" does not exist")
	}
	looked = append(looked, "no in-cluster service account (not running in a pod)")
	return fmt.Errorf("%w: give %s FILE or set $%s (%s); %s", ErrNotFound, Flag, EnvVar, strings.Join(looked, "; "), TryHint)
}

// homeFile is ~/.kube/config, read from $HOME when this is called (client-go
// reads it once, when the program starts).
func homeFile() string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
}
