package virtualnode

import (
	"os"
	"testing"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
)

// TestMain removes the fake DRA driver the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	dratest.RemoveBinary()
	os.Exit(code)
}
