package verify

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/dpkit/dpkit/pkg/verify"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// liveWriter prints each check on a terminal as soon as verify decides it:
// its verdict (in colour unless $NO_COLOR is set), its ID and its detail,
// cut to the terminal's width for checks that passed or were skipped; a
// check that failed or warned gets its whole detail, what it checks, the
// kubelet behaviour behind it, the fix and the link to docs/verify.md.
type liveWriter struct {
	w     io.Writer
	color bool
	width int // 0: unknown, nothing is cut
	idLen int
}

func newLiveWriter(w io.Writer, wide bool) *liveWriter {
	lw := &liveWriter{w: w, color: os.Getenv("NO_COLOR") == ""}
	if f, ok := w.(*os.File); ok && !wide {
		if width, _, err := term.GetSize(int(f.Fd())); err == nil {
			lw.width = width
		}
	}
	for _, c := range verify.Checks() {
		lw.idLen = max(lw.idLen, len(c.ID))
	}
	return lw
}

// ANSI SGR sequences of the verdicts.
var verdictColor = map[verify.Verdict]string{
	verify.Pass: "\x1b[32m",   // green
	verify.Fail: "\x1b[1;31m", // bold red
	verify.Warn: "\x1b[33m",   // yellow
	verify.Skip: "\x1b[2m",    // dim
}

const colorReset = "\x1b[0m"

// start says what runs, before the first check is decided.
func (lw *liveWriter) start(cfg verify.Config) {
	what := "the plugin registering through " + cfg.SocketDir
	if len(cfg.Command) > 0 {
		what = strings.Join(cfg.Command, " ")
	}
	fmt.Fprintf(lw.w, "Verifying %s against an emulated kubelet\n\n", what)
}

// result prints one decided check; it is verify.Config.Progress.
func (lw *liveWriter) result(res verify.Result) {
	verdict := fmt.Sprintf("%-4s", strings.ToUpper(string(res.Verdict)))
	if lw.color {
		verdict = verdictColor[res.Verdict] + verdict + colorReset
	}
	line := fmt.Sprintf("%s  %-*s  ", verdict, lw.idLen, res.ID)
	detail := strings.ReplaceAll(res.Detail, "\n", " ")
	if res.Verdict != verify.Fail && res.Verdict != verify.Warn {
		// The visible width of the line so far: the colour codes take none.
		if room := lw.width - (4 + 2 + lw.idLen + 2); lw.width > 0 && len([]rune(detail)) > room {
			detail = string([]rune(detail)[:max(room-3, 0)]) + "..."
		}
		fmt.Fprintln(lw.w, line+detail)
		return
	}
	pad := strings.Repeat(" ", 4+2)
	fmt.Fprintf(lw.w, "%s%s\n%s%s\n%sbased on: %s\n%sfix: %s\n%ssee: %s\n",
		line, detail, pad, res.Description, pad, res.Basis, pad, res.Fix, pad, res.Docs)
}
