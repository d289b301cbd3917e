package podresources

import (
	"context"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kubelet's rate limit of the PodResources endpoint: a token bucket
// refilled at DefaultQPS tokens per second holding DefaultBurstTokens.
const (
	DefaultQPS         = 100
	DefaultBurstTokens = 10
)

// ErrLimitExceeded is returned to a client whose request the rate limit
// rejected; its code is ResourceExhausted and its text the kubelet's.
var ErrLimitExceeded = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// Limiter decides whether a request may proceed now; *rate.Limiter
// implements it.
type Limiter interface {
	Allow() bool
}

// LimiterUnaryServerInterceptor rejects unary calls with ErrLimitExceeded
// when limiter does not allow them.
func LimiterUnaryServerInterceptor(limiter Limiter) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !limiter.Allow() {
			return nil, ErrLimitExceeded
		}
		return handler(ctx, req)
	}
}

// WithRateLimiter returns a server option that limits unary calls to qps
// per second with bursts of burst calls.
func WithRateLimiter(qps float64, burst int) grpc.ServerOption {
	return grpc.UnaryInterceptor(LimiterUnaryServerInterceptor(rate.NewLimiter(rate.Limit(qps), burst)))
}
