// Package httpserve runs an http.Server for as long as a context lives.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// ShutdownTimeout bounds how long in-flight requests may run once the
// context has ended.
const ShutdownTimeout = 5 * time.Second

// IdleTimeout is how long a keep-alive connection may stay idle when the
// server sets none: the kubelet's server's (90 s). With none at all, a
// client that opens connections and leaves them idle holds them (and
// their goroutines and buffers) for as long as it likes.
const IdleTimeout = 90 * time.Second

// Serve serves srv on l until ctx ends, then shuts the server down, giving
// in-flight requests up to ShutdownTimeout. It returns the server's error
// when it stops on its own, and nil after a shutdown. A server with no
// IdleTimeout gets IdleTimeout.
func Serve(ctx context.Context, srv *http.Server, l net.Listener) error {
	if srv.IdleTimeout == 0 {
		srv.IdleTimeout = IdleTimeout
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
