//go:build !linux

package main

import (
	"context"
	"errors"
	"time"
)

func becomeSubreaper() error {
	return errors.New("needs Linux (PR_SET_CHILD_SUBREAPER, /proc, cgroups)")
}

type scope struct{}
type snapshot struct{}
type leftovers struct{}

func machineScope() scope                                               { return scope{} }
func (scope) snapshot() snapshot                                        { return snapshot{} }
func (scope) find(snapshot) leftovers                                   { return leftovers{} }
func (scope) end(context.Context, leftovers, time.Duration, bool) error { return nil }
func (leftovers) empty() bool                                           { return true }
func (leftovers) String() string                                        { return "" }
func reapOrphans(int)                                                   {}
