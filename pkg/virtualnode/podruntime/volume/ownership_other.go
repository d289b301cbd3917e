//go:build !linux

package cri

import (
	"errors"
	"io/fs"
)

func groupTree(string, int, fs.FileMode) error {
	return errors.New("fsGroup needs Linux")
}
