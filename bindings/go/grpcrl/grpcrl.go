// Package grpcrl limits gRPC servers with quotalease: unary and stream server
// interceptors that take one token (or WithCost's) per call.
//
//	lim, _ := quotalease.New(quotalease.Config{URL: "redis://127.0.0.1:6379", Rate: "100/min"})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"))),
//		grpc.ChainStreamInterceptor(grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"))),
//	)
//
// A denied call ends with codes.ResourceExhausted before the handler runs. Its
// status carries an errdetails.RetryInfo (the retry delay in milliseconds)
// and its trailers carry "retry-after" (whole seconds, as in HTTP),
// "ratelimit-policy" and "ratelimit" (the IETF fields, lower-case as gRPC
// requires). An admitted call gets "ratelimit-policy" and "ratelimit" in its
// trailers, beside the handler's own.
//
// With WithConcurrency, the interceptors limit the calls of a key in flight
// at once instead of its rate: each call holds a permit
// (Limiter.AcquireConcurrentTier) until its handler returns. A call past the
// limit ends with the same RESOURCE_EXHAUSTED status and RetryInfo, and only
// "retry-after" in its trailers (the RateLimit fields describe rates).
//
// This package is a module of its own
// (github.com/quotalease/quotalease/bindings/go/grpcrl), so the core package
// never pulls in google.golang.org/grpc.
package grpcrl

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"
	"time"

	quotalease "github.com/quotalease/quotalease/bindings/go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// KeyFunc picks the rate-limit key of a call from its context and full
// method name ("/package.Service/Method"). Returning "" leaves the call
// unlimited (health checks, internal callers).
type KeyFunc func(ctx context.Context, fullMethod string) string

// ByPeer keys calls by the peer's IP address (without its port); the
// default when the key function is nil.
func ByPeer(ctx context.Context, _ string) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// ByMetadata keys calls by the first value of an incoming metadata entry
// (an API key, a tenant ID); calls without it are not limited.
func ByMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) string {
		if vs := metadata.ValueFromIncomingContext(ctx, name); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// AcquireFunc takes cost tokens for key. The default is the limiter's
// AcquireTierN with WithTier's tier (AcquireN without it); WithAcquire
// replaces it.
type AcquireFunc func(ctx context.Context, key string, cost uint64) (quotalease.Decision, error)

// Option configures the interceptors.
type Option func(*interceptor)

type interceptor struct {
	lim     *quotalease.Limiter
	key     KeyFunc
	cost    func(ctx context.Context, fullMethod string) uint64
	skip    func(ctx context.Context, fullMethod string) bool
	tier    func(ctx context.Context, fullMethod string) string
	wait    time.Duration
	acquire AcquireFunc
	denied  func(ctx context.Context, fullMethod string, d quotalease.Decision) error
	onError func(ctx context.Context, fullMethod string, err error) error
	// concurrent: a permit per call (WithConcurrency) instead of tokens.
	concurrent bool
	// rateOnly names the options given that only a rate limit uses
	// (WithCost, WithWait, WithAcquire): refused with WithConcurrency.
	rateOnly []string
}

// WithCost sets the tokens a call takes (default 1).
func WithCost(f func(ctx context.Context, fullMethod string) uint64) Option {
	return func(i *interceptor) { i.cost = f; i.rateOnly = append(i.rateOnly, "WithCost") }
}

// WithSkip leaves the calls for which f returns true unlimited.
func WithSkip(f func(ctx context.Context, fullMethod string) bool) Option {
	return func(i *interceptor) { i.skip = f }
}

// WithTier names the plan tier of a call (the limiter's Config.Tiers, its
// policy file or the shared store define them): f returns the tier, e.g.
// from the caller's credentials in the context, or "" for none (the
// limiter's DefaultTier, else its Limit). A key's own entry in the store
// or file wins over the tier named. An unknown tier goes to the error
// handler (KindConfig). WithAcquire replaces the call that uses it.
func WithTier(f func(ctx context.Context, fullMethod string) string) Option {
	return func(i *interceptor) { i.tier = f }
}

// WithWait has a call wait up to d for its tokens (Limiter.AcquireWait:
// in arrival order, from the local lease, a rate grant or the refill)
// instead of RESOURCE_EXHAUSTED. d <= 0: no wait (the default).
// WithAcquire replaces the call that uses it.
func WithWait(d time.Duration) Option {
	return func(i *interceptor) { i.wait = d; i.rateOnly = append(i.rateOnly, "WithWait") }
}

// WithAcquire replaces the call that takes the tokens (see AcquireFunc).
func WithAcquire(f AcquireFunc) Option {
	return func(i *interceptor) { i.acquire = f; i.rateOnly = append(i.rateOnly, "WithAcquire") }
}

// WithConcurrency limits the calls of a key in flight at once instead of
// its rate: each call takes a permit (Limiter.AcquireConcurrentTier; the
// limiter needs Config.Concurrency, else every call goes to the error
// handler), released when the handler returns (or panics); a stream holds
// its permit until its handler returns. A call past the limit ends as
// WithDeniedHandler says (DeniedError by default: RESOURCE_EXHAUSTED with
// the RetryInfo) with "retry-after" in its trailers and no RateLimit
// fields, which describe rates; an admitted call gets no trailers of its
// own. WithTier picks the tier whose "N concurrent" applies; WithSkip and
// the key function work as without it. WithCost, WithWait and WithAcquire
// do not apply: giving one with WithConcurrency panics when the
// interceptor is built, as a nil limiter does. For a rate and a
// concurrency limit both, chain two interceptors, the rate one first:
//
//	grpc.ChainUnaryInterceptor(
//		grpcrl.UnaryServerInterceptor(lim, key),
//		grpcrl.UnaryServerInterceptor(lim, key, grpcrl.WithConcurrency()),
//	)
func WithConcurrency() Option {
	return func(i *interceptor) { i.concurrent = true }
}

// WithDeniedHandler replaces the error a denied call ends with (the default
// is DeniedError's). The trailers are already set when it runs; returning
// nil lets the call through.
func WithDeniedHandler(f func(ctx context.Context, fullMethod string, d quotalease.Decision) error) Option {
	return func(i *interceptor) { i.denied = f }
}

// WithErrorHandler decides what a limiter error (a closed limiter, a key
// that is not UTF-8, a cost above the limit, an unknown tier) becomes. The
// default logs the error with the standard logger and ends the call with
// codes.Internal and a fixed message (the client never sees the key, the
// tier or the engine's message); returning nil lets the call through (fail
// open).
func WithErrorHandler(f func(ctx context.Context, fullMethod string, err error) error) Option {
	return func(i *interceptor) { i.onError = f }
}

// DeniedError is the status a denied call ends with: codes.ResourceExhausted,
// a message with the retry delay, and an errdetails.RetryInfo.
func DeniedError(d quotalease.Decision) error {
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limited; retry after %d ms", d.RetryAfterMs))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter())}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Trailer is a decision's metadata: "ratelimit-policy", "ratelimit", and
// "retry-after" when denied.
func Trailer(d quotalease.Decision) metadata.MD {
	md := metadata.MD{}
	for name, values := range d.Headers() {
		md.Append(strings.ToLower(name), values...)
	}
	return md
}

func newInterceptor(lim *quotalease.Limiter, key KeyFunc, opts []Option) *interceptor {
	if lim == nil {
		panic("grpcrl: the limiter is nil")
	}
	i := &interceptor{lim: lim, key: key}
	if i.key == nil {
		i.key = ByPeer
	}
	i.denied = func(_ context.Context, _ string, d quotalease.Decision) error { return DeniedError(d) }
	i.onError = func(_ context.Context, fullMethod string, err error) error {
		log.Printf("quotalease/grpcrl: %s: %v", fullMethod, err)
		return status.Error(codes.Internal, "rate limiter error")
	}
	for _, o := range opts {
		o(i)
	}
	if i.concurrent && len(i.rateOnly) > 0 {
		panic("grpcrl: " + strings.Join(i.rateOnly, " and ") + " cannot be combined with WithConcurrency " +
			"(a call takes one permit); chain a second interceptor without WithConcurrency for a rate limit too")
	}
	return i
}

// permit takes the call's permit (WithConcurrency): the admitted permit to
// close when the handler returns (nil when none was taken), the trailer to
// set, and the error to end the call with.
func (i *interceptor) permit(ctx context.Context, method string) (*quotalease.Permit, metadata.MD, error) {
	if i.skip != nil && i.skip(ctx, method) {
		return nil, nil, nil
	}
	raw := i.key(ctx, method)
	if raw == "" {
		return nil, nil, nil
	}
	tier := ""
	if i.tier != nil {
		tier = i.tier(ctx, method)
	}
	k, err := quotalease.HTTPKey(raw)
	var p *quotalease.Permit
	if err == nil {
		p, err = i.lim.AcquireConcurrentTier(k, tier)
	}
	if err != nil {
		return nil, nil, i.onError(ctx, method, err)
	}
	if !p.Allowed {
		p.Close() // a denied permit holds nothing
		md := metadata.Pairs("retry-after", p.Decision.Headers().Get("Retry-After"))
		return nil, md, i.denied(ctx, method, p.Decision)
	}
	return p, nil, nil
}

// check returns the trailer to set, and the error to end the call with.
func (i *interceptor) check(ctx context.Context, method string) (metadata.MD, error) {
	if i.skip != nil && i.skip(ctx, method) {
		return nil, nil
	}
	raw := i.key(ctx, method)
	if raw == "" {
		return nil, nil
	}
	cost := uint64(1)
	if i.cost != nil {
		cost = i.cost(ctx, method)
	}
	k, err := quotalease.HTTPKey(raw)
	var d quotalease.Decision
	switch {
	case err != nil:
	case i.acquire != nil:
		d, err = i.acquire(ctx, k, cost)
	case i.wait > 0:
		tier := ""
		if i.tier != nil {
			tier = i.tier(ctx, method)
		}
		d, err = i.lim.AcquireWait(k, cost, tier, i.wait)
	case i.tier != nil:
		d, err = i.lim.AcquireTierN(k, cost, i.tier(ctx, method))
	default:
		d, err = i.lim.AcquireN(k, cost)
	}
	if err != nil {
		return nil, i.onError(ctx, method, err)
	}
	if !d.Allowed {
		return Trailer(d), i.denied(ctx, method, d)
	}
	return Trailer(d), nil
}

// UnaryServerInterceptor limits unary calls by key (ByPeer when nil).
func UnaryServerInterceptor(lim *quotalease.Limiter, key KeyFunc, opts ...Option) grpc.UnaryServerInterceptor {
	i := newInterceptor(lim, key, opts)
	if i.concurrent {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			p, md, err := i.permit(ctx, info.FullMethod)
			if md != nil {
				_ = grpc.SetTrailer(ctx, md)
			}
			if err != nil {
				return nil, err
			}
			defer p.Close() // releases an admitted permit, also when the handler panics; nil: none
			return handler(ctx, req)
		}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := i.check(ctx, info.FullMethod)
		if md != nil {
			_ = grpc.SetTrailer(ctx, md)
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor limits streaming calls by key (ByPeer when nil):
// one acquire when the stream opens, not one per message (WithConcurrency:
// one permit, held until the stream's handler returns).
func StreamServerInterceptor(lim *quotalease.Limiter, key KeyFunc, opts ...Option) grpc.StreamServerInterceptor {
	i := newInterceptor(lim, key, opts)
	if i.concurrent {
		return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			p, md, err := i.permit(ss.Context(), info.FullMethod)
			if md != nil {
				ss.SetTrailer(md)
			}
			if err != nil {
				return err
			}
			defer p.Close()
			return handler(srv, ss)
		}
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := i.check(ss.Context(), info.FullMethod)
		if md != nil {
			ss.SetTrailer(md)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
