//go:build !linux

package cri

import (
	"errors"
	"io/fs"
)

func mountTmpfs(string, int64) error {
	return errors.New("memory-backed volumes need Linux")
}

func unmountVolumes(string) error { return nil }

func openSubPath(string, string, fs.FileMode) (int, error) {
	return -1, errors.New("subPath needs Linux")
}

func bindSubPath(int, string) error { return errors.New("subPath needs Linux") }
