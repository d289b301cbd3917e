// Package archtest holds the import rules of docs/architecture.md as a
// test, so that a change breaking one fails "go test" rather than waiting
// for a reviewer. It has no code of its own.
package archtest
