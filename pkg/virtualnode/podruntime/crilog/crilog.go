// Package crilog reads container log files in the CRI log format, the
// one the kubelet reads and container runtimes write:
// "<RFC3339Nano> <stream> <P|F> <msg>" a line.
package crilog

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"time"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// logLine is one parsed CRI log line.
type logLine struct {
	ts      time.Time
	raw     []byte // the timestamp field
	stream  []byte // stdout or stderr
	partial bool
	msg     []byte
}

// LogLine is one line of a CRI log file: the stream it came from (stdout
// or stderr), its text and whether it is a partial line (the runtime
// splits long lines).
type LogLine struct {
	Stream  string
	Partial bool
	Msg     []byte
}

// ParseLogLine parses one CRI log line without its newline:
// "<RFC3339Nano> <stream> <P|F> <msg>".
func ParseLogLine(line []byte) (LogLine, bool) {
	l, ok := parseLine(line)
	return LogLine{Stream: string(l.stream), Partial: l.partial, Msg: l.msg}, ok
}

// parseLine parses "<RFC3339Nano> <stream> <P|F> <msg>".
func parseLine(line []byte) (logLine, bool) {
	var l logLine
	i := bytes.IndexByte(line, ' ')
	if i < 0 {
		return l, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(line[:i]))
	if err != nil {
		return l, false
	}
	l.ts, l.raw = ts, line[:i]
	rest := line[i+1:]
	j := bytes.IndexByte(rest, ' ')
	if j < 0 {
		return l, false
	}
	l.stream = rest[:j]
	rest = rest[j+1:]
	if len(rest) < 1 {
		return l, false
	}
	l.partial = rest[0] == 'P'
	if len(rest) > 1 {
		l.msg = rest[2:]
	}
	return l, true
}

// CopyLog writes the container output selected by opts from f, a log
// file in the CRI format (what container runtimes write and what the
// kubelet reads). With Follow it keeps reading, every poll, while live
// reports the container running.
func CopyLog(ctx context.Context, f *os.File, w io.Writer, opts backend.LogOptions, live func() bool, poll time.Duration) error {
	var written int
	limit := func(b []byte) ([]byte, bool) {
		if opts.LimitBytes <= 0 {
			return b, false
		}
		left := opts.LimitBytes - written
		if left <= 0 {
			return nil, true
		}
		if len(b) > left {
			return b[:left], true
		}
		return b, false
	}
	emit := func(l logLine) (bool, error) {
		if !opts.SinceTime.IsZero() && l.ts.Before(opts.SinceTime) {
			return false, nil
		}
		var out []byte
		if opts.Timestamps {
			out = append(append(out, l.raw...), ' ')
		}
		out = append(out, l.msg...)
		if !l.partial {
			out = append(out, '\n')
		}
		out, stop := limit(out)
		n, err := w.Write(out)
		written += n
		return stop, err
	}

	br := bufio.NewReader(f)
	var pending []byte
	// The lines present now, subject to tail.
	var lines []logLine
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			pending = line
			break
		}
		if l, ok := parseLine(bytes.TrimSuffix(line, []byte("\n"))); ok {
			lines = append(lines, l)
		}
	}
	if opts.Tail >= 0 && len(lines) > opts.Tail {
		lines = lines[len(lines)-opts.Tail:]
	}
	for _, l := range lines {
		if stop, err := emit(l); stop || err != nil {
			return err
		}
	}
	if !opts.Follow {
		return nil
	}
	return follow(ctx, br, pending, live, poll, emit)
}

// Follow reads the lines written to f from its current offset on, every
// poll, and gives each to emit until emit says stop or fails, live
// reports the container stopped (after a last read), or ctx ends.
func Follow(ctx context.Context, f io.Reader, live func() bool, poll time.Duration, emit func(LogLine) (stop bool, err error)) error {
	return follow(ctx, bufio.NewReader(f), nil, live, poll, func(l logLine) (bool, error) {
		return emit(LogLine{Stream: string(l.stream), Partial: l.partial, Msg: l.msg})
	})
}

// follow is Follow from br, with pending the start of a line read
// before.
func follow(ctx context.Context, br *bufio.Reader, pending []byte, live func() bool, poll time.Duration, emit func(logLine) (bool, error)) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		wasLive := live()
		for {
			chunk, err := br.ReadBytes('\n')
			pending = append(pending, chunk...)
			if err != nil {
				break
			}
			if l, ok := parseLine(bytes.TrimSuffix(pending, []byte("\n"))); ok {
				if stop, err := emit(l); stop || err != nil {
					return err
				}
			}
			pending = nil
		}
		if !wasLive {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
