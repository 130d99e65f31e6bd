package grpcrl_test

import (
	"context"
	"errors"
	"log"
	"net"
	"strings"
	"sync"
	"testing"

	quotalease "github.com/quotalease/quotalease/bindings/go"
	"github.com/quotalease/quotalease/bindings/go/grpcrl"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// WithConcurrency on a real gRPC server: a permit per call, held while the
// handler runs and released when it returns, so a call whose response has
// arrived has given its permit back. The handlers of the gate service below
// announce themselves on entered and wait for a value on open: no sleeps.

// gate is the implementation of the test.Gate service: Hold (unary) and
// HoldStream (a server stream of one message) announce their request on
// entered and wait until the test opens the gate of that message, except
// for the request "fail", which ends with codes.FailedPrecondition at once.
type gate struct {
	entered chan string
	mu      sync.Mutex
	gates   map[string]chan struct{}
	opened  map[string]bool
}

func newGate(t *testing.T) *gate {
	g := &gate{entered: make(chan string, 64), gates: map[string]chan struct{}{}, opened: map[string]bool{}}
	t.Cleanup(func() { // a failed test leaves no handler waiting
		g.mu.Lock()
		defer g.mu.Unlock()
		for msg, ch := range g.gates {
			if !g.opened[msg] {
				close(ch)
			}
		}
	})
	return g
}

func (g *gate) of(msg string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[msg] == nil {
		g.gates[msg] = make(chan struct{})
	}
	return g.gates[msg]
}

// open lets the call with request msg return.
func (g *gate) open(msg string) {
	ch := g.of(msg)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opened[msg] = true
	close(ch)
}

func (g *gate) hold(msg string) error {
	if msg == "fail" {
		return status.Error(codes.FailedPrecondition, "handler failed")
	}
	g.entered <- msg
	<-g.of(msg)
	return nil
}

func gateUnary(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	h := func(_ context.Context, req any) (any, error) {
		msg := *req.(*[]byte)
		if err := srv.(*gate).hold(string(msg)); err != nil {
			return nil, err
		}
		out := append([]byte("done:"), msg...)
		return &out, nil
	}
	if icpt == nil {
		return h(ctx, &in)
	}
	return icpt(ctx, &in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Gate/Hold"}, h)
}

func gateStream(srv any, ss grpc.ServerStream) error {
	var in []byte
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	if err := srv.(*gate).hold(string(in)); err != nil {
		return err
	}
	out := append([]byte("done:"), in...)
	return ss.SendMsg(&out)
}

var gateService = grpc.ServiceDesc{
	ServiceName: "test.Gate",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Hold", Handler: gateUnary}},
	Streams:     []grpc.StreamDesc{{StreamName: "HoldStream", Handler: gateStream, ServerStreams: true}},
}

func serveGate(t *testing.T, g *gate, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&gateService, g)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype("raw")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// concurrencyLimiter: concurrency n, manual clock (a denial's retry delay
// is 250 ms), and tiers when given.
func concurrencyLimiter(t *testing.T, n uint64, tiers string) *quotalease.Limiter {
	t.Helper()
	cfg := quotalease.DefaultConfig()
	cfg.Limit, cfg.WindowMs = 1000, 60000
	cfg.Concurrency = n
	cfg.Tiers = tiers
	cfg.ManualClock = true
	lim, err := quotalease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

type result struct {
	out     string
	err     error
	trailer metadata.MD
}

func hold(conn *grpc.ClientConn, ctx context.Context, msg string) result {
	in, out := []byte(msg), []byte(nil)
	var tr metadata.MD
	err := conn.Invoke(ctx, "/test.Gate/Hold", &in, &out, grpc.Trailer(&tr))
	return result{string(out), err, tr}
}

func holdStream(conn *grpc.ClientConn, ctx context.Context, msg string) result {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/test.Gate/HoldStream")
	if err != nil {
		return result{err: err}
	}
	in := []byte(msg)
	if err := cs.SendMsg(&in); err != nil {
		return result{err: err}
	}
	if err := cs.CloseSend(); err != nil {
		return result{err: err}
	}
	var out []byte
	if err := cs.RecvMsg(&out); err != nil {
		return result{err: err, trailer: cs.Trailer()}
	}
	// the end of the stream: the handler has returned
	if err := cs.RecvMsg(new([]byte)); err == nil {
		return result{err: errors.New("a second message")}
	}
	return result{out: string(out), trailer: cs.Trailer()}
}

// inFlight starts call(msg) and waits until its handler holds the gate;
// the result arrives on the channel returned.
func inFlight(t *testing.T, g *gate, call func(string) result, msg string) chan result {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- call(msg) }()
	select {
	case got := <-g.entered:
		if got != msg {
			t.Fatalf("entered %q, want %q", got, msg)
		}
	case r := <-done:
		t.Fatalf("%q did not reach its handler: %q %v", msg, r.out, r.err)
	}
	return done
}

// checkConcurrencyDenied: RESOURCE_EXHAUSTED with the RetryInfo of the
// permit's denial (250 ms on a manual clock), "retry-after" and no
// RateLimit fields in the trailer.
func checkConcurrencyDenied(t *testing.T, r result) {
	t.Helper()
	st, ok := status.FromError(r.err)
	if !ok || st.Code() != codes.ResourceExhausted || st.Message() != "rate limited; retry after 250 ms" {
		t.Fatalf("want ResourceExhausted, got %q %v", r.out, r.err)
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil || info.GetRetryDelay().AsDuration().Milliseconds() != 250 {
		t.Fatalf("RetryInfo in %v", st.Details())
	}
	if ra := r.trailer.Get("retry-after"); len(ra) != 1 || ra[0] != "1" {
		t.Fatalf("retry-after %v", r.trailer)
	}
	if len(r.trailer.Get("ratelimit")) != 0 || len(r.trailer.Get("ratelimit-policy")) != 0 {
		t.Fatalf("RateLimit fields for a permit: %v", r.trailer)
	}
}

func checkDone(t *testing.T, r result, msg string) {
	t.Helper()
	if r.err != nil || r.out != "done:"+msg {
		t.Fatalf("%s: %q %v", msg, r.out, r.err)
	}
	if len(r.trailer.Get("ratelimit")) != 0 || len(r.trailer.Get("retry-after")) != 0 {
		t.Fatalf("%s: trailers of an admitted call %v", msg, r.trailer)
	}
}

func TestWithConcurrencyUnaryNInFlight(t *testing.T) {
	lim := concurrencyLimiter(t, 2, "")
	g := newGate(t)
	conn := serveGate(t, g, grpc.ChainUnaryInterceptor(
		grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency())))
	call := func(msg string) result { return hold(conn, withKey("k"), msg) }

	a := inFlight(t, g, call, "a")
	b := inFlight(t, g, call, "b")
	// Two in flight: the third is denied at once, without reaching its handler.
	checkConcurrencyDenied(t, call("c"))
	// Another key has its own permits.
	other := inFlight(t, g, func(msg string) result { return hold(conn, withKey("k2"), msg) }, "other")
	g.open("other")
	checkDone(t, <-other, "other")
	// One returns: its permit is free again, and the next is denied again.
	g.open("a")
	checkDone(t, <-a, "a")
	c := inFlight(t, g, call, "c")
	checkConcurrencyDenied(t, call("d"))
	g.open("b")
	g.open("c")
	checkDone(t, <-b, "b")
	checkDone(t, <-c, "c")
	// Both returned: two more fit.
	d := inFlight(t, g, call, "d")
	e := inFlight(t, g, call, "e")
	g.open("d")
	g.open("e")
	checkDone(t, <-d, "d")
	checkDone(t, <-e, "e")
	if m := lim.Metrics(); m.Denied != 2 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestWithConcurrencyAFailedOrPanickingHandlerFreesItsPermit(t *testing.T) {
	lim := concurrencyLimiter(t, 1, "")
	g := newGate(t)
	conn := serveGate(t, g,
		grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency())),
		grpc.ChainStreamInterceptor(grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency())))
	// A handler's error ends the call and frees the permit: each of these
	// would be RESOURCE_EXHAUSTED if the one before kept its permit.
	for i := 0; i < 3; i++ {
		for _, r := range []result{hold(conn, withKey("k"), "fail"), holdStream(conn, withKey("k"), "fail")} {
			if st, _ := status.FromError(r.err); st.Code() != codes.FailedPrecondition {
				t.Fatalf("call %d: %v", i, r.err)
			}
		}
	}
	// A panicking handler (the interceptors called directly: grpc-go does not
	// recover a handler's panic) frees its permit too.
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k"))
	unary := grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency())
	stream := grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency())
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if r := recover(); r != "handler panicked" {
				t.Fatalf("%s: recovered %v", name, r)
			}
		}()
		f()
	}
	for i := 0; i < 3; i++ {
		panics("unary", func() {
			_, _ = unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/test.Gate/Hold"}, func(context.Context, any) (any, error) {
				panic("handler panicked")
			})
		})
		panics("stream", func() {
			_ = stream(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/test.Gate/HoldStream"}, func(any, grpc.ServerStream) error {
				panic("handler panicked")
			})
		})
	}
	// Every permit is free: a stream holds the only one until its handler
	// returns, and a unary call meanwhile is denied.
	s := inFlight(t, g, func(msg string) result { return holdStream(conn, withKey("k"), msg) }, "s")
	checkConcurrencyDenied(t, hold(conn, withKey("k"), "u"))
	checkConcurrencyDenied(t, holdStream(conn, withKey("k"), "t"))
	g.open("s")
	checkDone(t, <-s, "s")
	u := inFlight(t, g, func(msg string) result { return hold(conn, withKey("k"), msg) }, "u")
	g.open("u")
	checkDone(t, <-u, "u")
}

// fakeStream is the ServerStream of a stream interceptor called directly.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context  { return f.ctx }
func (f fakeStream) SetTrailer(md metadata.MD) {}

func TestWithConcurrencyTierSkipAndErrors(t *testing.T) {
	lim := concurrencyLimiter(t, 3, "free=1000/min, 1 concurrent")
	g := newGate(t)
	var mu sync.Mutex
	var methods []string
	tier := grpcrl.WithTier(func(ctx context.Context, method string) string {
		mu.Lock()
		methods = append(methods, method)
		mu.Unlock()
		if vs := metadata.ValueFromIncomingContext(ctx, "x-plan"); len(vs) > 0 {
			return vs[0]
		}
		return ""
	})
	skip := grpcrl.WithSkip(func(ctx context.Context, _ string) bool {
		return len(metadata.ValueFromIncomingContext(ctx, "x-internal")) > 0
	})
	conn := serveGate(t, g, grpc.ChainUnaryInterceptor(
		grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency(), tier, skip)))
	plan := func(key, p string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(key), "x-plan", p)
	}
	// free: one in flight.
	f := inFlight(t, g, func(msg string) result { return hold(conn, plan("f", "free"), msg) }, "f1")
	checkConcurrencyDenied(t, hold(conn, plan("f", "free"), "f2"))
	// WithSkip and a call without the key take no permit.
	internal := inFlight(t, g, func(msg string) result {
		return hold(conn, metadata.AppendToOutgoingContext(plan("f", "free"), "x-internal", "1"), msg)
	}, "internal")
	unkeyed := inFlight(t, g, func(msg string) result { return hold(conn, context.Background(), msg) }, "unkeyed")
	// No tier: the limiter's Concurrency (3).
	var held []chan result
	for _, msg := range []string{"n1", "n2", "n3"} {
		held = append(held, inFlight(t, g, func(msg string) result { return hold(conn, withKey("n"), msg) }, msg))
	}
	checkConcurrencyDenied(t, hold(conn, withKey("n"), "n4"))
	for i, msg := range []string{"f1", "internal", "unkeyed", "n1", "n2", "n3"} {
		g.open(msg)
		checkDone(t, <-append([]chan result{f, internal, unkeyed}, held...)[i], msg)
	}
	// free again: the freed permit of "f" is taken at once
	f = inFlight(t, g, func(msg string) result { return hold(conn, plan("f", "free"), msg) }, "f3")
	g.open("f3")
	checkDone(t, <-f, "f3")
	mu.Lock()
	if methods[0] != "/test.Gate/Hold" || len(methods) != 7 {
		t.Fatalf("the tier function sees the method of each keyed, unskipped call (f1, f2, n1-n4, f3): %v", methods)
	}
	mu.Unlock()
	// An unknown tier is a limiter error: logged, and codes.Internal with a
	// fixed message.
	var logged lockedBuffer
	prev := log.Writer()
	log.SetOutput(&logged)
	defer log.SetOutput(prev)
	r := hold(conn, plan("g", "gold"), "g")
	if st, _ := status.FromError(r.err); st.Code() != codes.Internal || st.Message() != "rate limiter error" {
		t.Fatalf("unknown tier: %v", r.err)
	}
	if !strings.Contains(logged.String(), `unknown tier "gold"`) {
		t.Fatalf("unknown tier, logged: %q", logged.String())
	}
}

func TestWithConcurrencyDeniedHandlerAndConfigErrors(t *testing.T) {
	lim := concurrencyLimiter(t, 1, "")
	g := newGate(t)
	var mu sync.Mutex
	var seen quotalease.Decision
	denied := grpcrl.WithDeniedHandler(func(_ context.Context, m string, d quotalease.Decision) error {
		mu.Lock()
		defer mu.Unlock()
		seen = d
		return status.Errorf(codes.Unavailable, "busy: %s", m)
	})
	conn := serveGate(t, g, grpc.ChainStreamInterceptor(
		grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency(), denied)))
	s := inFlight(t, g, func(msg string) result { return holdStream(conn, withKey("k"), msg) }, "s")
	r := holdStream(conn, withKey("k"), "t")
	if st, _ := status.FromError(r.err); st.Code() != codes.Unavailable || st.Message() != "busy: /test.Gate/HoldStream" {
		t.Fatalf("custom denial: %v", r.err)
	}
	if ra := r.trailer.Get("retry-after"); len(ra) != 1 || ra[0] != "1" {
		t.Fatalf("the trailer is set before the denied handler: %v", r.trailer)
	}
	mu.Lock()
	// (a permit denial stays local recheck_ms, 250, from when it was decided)
	if seen.Allowed || seen.Limit != 1 || seen.RetryAfterMs < 1 || seen.RetryAfterMs > 250 {
		t.Fatalf("the permit's decision: %+v", seen)
	}
	mu.Unlock()
	g.open("s")
	checkDone(t, <-s, "s")

	// A limiter without Concurrency: every call goes to the error handler.
	var got error
	onError := grpcrl.WithErrorHandler(func(_ context.Context, _ string, err error) error {
		mu.Lock()
		defer mu.Unlock()
		got = err
		return status.Error(codes.Unavailable, "no permits")
	})
	conn = serveGate(t, g, grpc.ChainUnaryInterceptor(
		grpcrl.UnaryServerInterceptor(limiter(t, 10), grpcrl.ByMetadata("x-api-key"), grpcrl.WithConcurrency(), onError)))
	r = hold(conn, withKey("k"), "x")
	mu.Lock()
	if st, _ := status.FromError(r.err); st.Code() != codes.Unavailable || !errors.Is(got, quotalease.ErrConfig) {
		t.Fatalf("no concurrency: %v %v", r.err, got)
	}
	mu.Unlock()

	// WithCost, WithWait and WithAcquire with WithConcurrency panic at setup.
	for name, opt := range map[string]grpcrl.Option{
		"WithCost": grpcrl.WithCost(func(context.Context, string) uint64 { return 2 }),
		"WithWait": grpcrl.WithWait(0),
		"WithAcquire": grpcrl.WithAcquire(func(context.Context, string, uint64) (quotalease.Decision, error) {
			return quotalease.Decision{}, nil
		}),
	} {
		for kind, build := range map[string]func(){
			"unary":  func() { grpcrl.UnaryServerInterceptor(lim, nil, opt, grpcrl.WithConcurrency()) },
			"stream": func() { grpcrl.StreamServerInterceptor(lim, nil, grpcrl.WithConcurrency(), opt) },
		} {
			func() {
				defer func() {
					r, _ := recover().(string)
					if !strings.Contains(r, name+" cannot be combined with WithConcurrency") {
						t.Fatalf("%s %s: want a panic at setup, got %q", kind, name, r)
					}
				}()
				build()
			}()
		}
	}
}
