package grpcrl_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	quotalease "github.com/quotalease/quotalease/bindings/go"
	"github.com/quotalease/quotalease/bindings/go/grpcrl"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// rawCodec carries []byte messages as they are: a real gRPC server and
// client with a hand-written service descriptor, no protoc.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

func init() { encoding.RegisterCodec(rawCodec{}) }

func unaryHandler(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	h := func(ctx context.Context, req any) (any, error) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-app", "1"))
		out := append([]byte("echo:"), *req.(*[]byte)...)
		return &out, nil
	}
	if icpt == nil {
		return h(ctx, &in)
	}
	return icpt(ctx, &in, &grpc.UnaryServerInfo{FullMethod: "/test.Echo/Unary"}, h)
}

// countHandler streams the numbers 0..n-1 for a request "n".
func countHandler(_ any, ss grpc.ServerStream) error {
	var in []byte
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	n, _ := strconv.Atoi(string(in))
	for i := 0; i < n; i++ {
		out := []byte(strconv.Itoa(i))
		if err := ss.SendMsg(&out); err != nil {
			return err
		}
	}
	return nil
}

var echoService = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Unary", Handler: unaryHandler}},
	Streams:     []grpc.StreamDesc{{StreamName: "Count", Handler: countHandler, ServerStreams: true}},
}

func serve(t *testing.T, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&echoService, struct{}{})
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

func limiter(t *testing.T, limit uint64) *quotalease.Limiter {
	t.Helper()
	cfg := quotalease.DefaultConfig()
	cfg.Limit = limit
	cfg.WindowMs = 60000
	cfg.ManualClock = true
	lim, err := quotalease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
}

func unary(conn *grpc.ClientConn, ctx context.Context, trailer *metadata.MD) (string, error) {
	in, out := []byte("hi"), []byte(nil)
	err := conn.Invoke(ctx, "/test.Echo/Unary", &in, &out, grpc.Trailer(trailer))
	return string(out), err
}

func count(conn *grpc.ClientConn, ctx context.Context, n int) ([]string, metadata.MD, error) {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/test.Echo/Count")
	if err != nil {
		return nil, nil, err
	}
	in := []byte(strconv.Itoa(n))
	if err := cs.SendMsg(&in); err != nil {
		return nil, nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, nil, err
	}
	var got []string
	for {
		var out []byte
		err := cs.RecvMsg(&out)
		if errors.Is(err, io.EOF) {
			return got, cs.Trailer(), nil
		}
		if err != nil {
			return got, cs.Trailer(), err
		}
		got = append(got, string(out))
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func checkExhausted(t *testing.T, err error, trailer metadata.MD) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted || !strings.HasPrefix(st.Message(), "rate limited; retry after ") {
		t.Fatalf("want ResourceExhausted, got %v", err)
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil || info.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("no RetryInfo with a delay in %v", st.Details())
	}
	if ra := trailer.Get("retry-after"); len(ra) != 1 || atoi(ra[0]) < 1 {
		t.Fatalf("retry-after %v", ra)
	}
	if rl := trailer.Get("ratelimit"); len(rl) != 1 || !strings.HasPrefix(rl[0], `"default";r=0;t=`) {
		t.Fatalf("ratelimit %v", rl)
	}
	if p := trailer.Get("ratelimit-policy"); len(p) != 1 || !strings.HasPrefix(p[0], `"default";q=`) {
		t.Fatalf("ratelimit-policy %v", p)
	}
}

func TestUnaryHeadersAndResourceExhausted(t *testing.T) {
	lim := limiter(t, 3)
	skipInternal := grpcrl.WithSkip(func(ctx context.Context, _ string) bool {
		return len(metadata.ValueFromIncomingContext(ctx, "x-internal")) > 0
	})
	conn := serve(t, grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("X-Api-Key"), skipInternal)))
	for i := 0; i < 3; i++ {
		var tr metadata.MD
		out, err := unary(conn, withKey("k1"), &tr)
		if err != nil || out != "echo:hi" {
			t.Fatalf("call %d: %q %v", i, out, err)
		}
		if got := tr.Get("x-app"); len(got) != 1 {
			t.Fatalf("the handler's trailer is lost: %v", tr)
		}
		if got := tr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"default";q=3;w=60` {
			t.Fatalf("ratelimit-policy %v", got)
		}
		if got := tr.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"default";r=`+strconv.Itoa(2-i)+`;`) {
			t.Fatalf("ratelimit %v", got)
		}
		if len(tr.Get("retry-after")) != 0 {
			t.Fatal("retry-after on an admitted call")
		}
	}
	var tr metadata.MD
	_, err := unary(conn, withKey("k1"), &tr)
	checkExhausted(t, err, tr)
	// WithSkip: not limited, no trailers.
	tr = nil
	if _, err := unary(conn, metadata.AppendToOutgoingContext(withKey("k1"), "x-internal", "1"), &tr); err != nil ||
		len(tr.Get("ratelimit")) != 0 {
		t.Fatalf("skipped call: %v %v", err, tr)
	}
	// Another key is independent; a call without the key is not limited.
	if _, err := unary(conn, withKey("k2"), new(metadata.MD)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		var tr metadata.MD
		if _, err := unary(conn, context.Background(), &tr); err != nil || len(tr.Get("ratelimit")) != 0 {
			t.Fatalf("unkeyed call: %v %v", err, tr)
		}
	}
	if m := lim.Metrics(); m.Admitted != 4 || m.Denied != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestStreamOneAcquirePerStreamAndCost(t *testing.T) {
	lim := limiter(t, 4)
	cost := grpcrl.WithCost(func(context.Context, string) uint64 { return 2 })
	conn := serve(t, grpc.ChainStreamInterceptor(grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), cost)))
	got, tr, err := count(conn, withKey("s"), 4)
	if err != nil || strings.Join(got, ",") != "0,1,2,3" {
		t.Fatalf("stream: %v %v", got, err)
	}
	if rl := tr.Get("ratelimit"); len(rl) != 1 || !strings.HasPrefix(rl[0], `"default";r=2;`) {
		t.Fatalf("stream trailer %v", tr)
	}
	if _, _, err := count(conn, withKey("s"), 1); err != nil { // no token left after this
		t.Fatal(err)
	}
	_, tr, err = count(conn, withKey("s"), 1)
	checkExhausted(t, err, tr)
	if m := lim.Metrics(); m.Admitted != 2 || m.Denied != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestDefaultKeyIsThePeerAndHandlers(t *testing.T) {
	lim := limiter(t, 1)
	var seen []string
	acquire := grpcrl.WithAcquire(func(ctx context.Context, key string, cost uint64) (quotalease.Decision, error) {
		// A limiter with plan tiers would get the tier from ctx here (issue 15).
		seen = append(seen, key)
		return lim.AcquireN(key, cost)
	})
	denied := grpcrl.WithDeniedHandler(func(_ context.Context, m string, d quotalease.Decision) error {
		return status.Errorf(codes.Unavailable, "busy: %s %s", m, d.Reason)
	})
	conn := serve(t, grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, nil, acquire, denied)))
	if _, err := unary(conn, context.Background(), new(metadata.MD)); err != nil {
		t.Fatal(err)
	}
	var tr metadata.MD
	_, err := unary(conn, context.Background(), &tr)
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "busy: /test.Echo/Unary exhausted" {
		t.Fatalf("custom denial: %v", err)
	}
	if len(tr.Get("retry-after")) != 1 {
		t.Fatalf("the trailers are set before the denied handler: %v", tr)
	}
	if strings.Join(seen, ",") != "127.0.0.1,127.0.0.1" {
		t.Fatalf("keys %v", seen)
	}
}

func TestLimiterErrors(t *testing.T) {
	lim := limiter(t, 3)
	tooMuch := grpcrl.WithCost(func(context.Context, string) uint64 { return 100 })
	conn := serve(t, grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, nil, tooMuch)))
	var logged lockedBuffer
	prev := log.Writer()
	log.SetOutput(&logged)
	defer log.SetOutput(prev)
	_, err := unary(conn, context.Background(), new(metadata.MD))
	if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != "rate limiter error" {
		t.Fatalf("a cost above the limit: %v", err)
	}
	if got := logged.String(); !strings.Contains(got, "/test.Echo/Unary") || !strings.Contains(got, "cost") {
		t.Fatalf("the error is logged with the method, not sent: %q", got)
	}

	// Fail open through WithErrorHandler; a closed limiter is the error here.
	closed := limiter(t, 3)
	closed.Close()
	failOpen := grpcrl.WithErrorHandler(func(_ context.Context, _ string, err error) error {
		if !errors.Is(err, quotalease.ErrClosed) {
			t.Errorf("want ErrClosed, got %v", err)
		}
		return nil
	})
	conn = serve(t, grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(closed, nil, failOpen)))
	if out, err := unary(conn, context.Background(), new(metadata.MD)); err != nil || out != "echo:hi" {
		t.Fatalf("fail open: %q %v", out, err)
	}

	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "limiter is nil") {
			t.Fatalf("want a panic naming the nil limiter at setup, got %v", r)
		}
	}()
	grpcrl.UnaryServerInterceptor(nil, nil)
}

func TestWithTierPicksThePlanPerCall(t *testing.T) {
	cfg := quotalease.DefaultConfig()
	cfg.Limit, cfg.WindowMs = 100, 60000
	cfg.Tiers = "free=1/min; pro=2/s, 3/min"
	cfg.ManualClock = true
	lim, err := quotalease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	var methods []string
	tier := grpcrl.WithTier(func(ctx context.Context, method string) string {
		methods = append(methods, method)
		if vs := metadata.ValueFromIncomingContext(ctx, "x-plan"); len(vs) > 0 {
			return vs[0]
		}
		return ""
	})
	conn := serve(t,
		grpc.ChainUnaryInterceptor(grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), tier)),
		grpc.ChainStreamInterceptor(grpcrl.StreamServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), tier)))
	plan := func(key, p string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(key), "x-plan", p)
	}
	// pro: two rules, both in the trailers; the 1 s rule binds first.
	var tr metadata.MD
	if _, err := unary(conn, plan("p", "pro"), &tr); err != nil {
		t.Fatal(err)
	}
	if got := tr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"1s";q=2;w=1, "1min";q=3;w=60` {
		t.Fatalf("ratelimit-policy %v", got)
	}
	if got := tr.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"1s";r=1;`) {
		t.Fatalf("ratelimit %v", got)
	}
	// free: one token a minute, then RESOURCE_EXHAUSTED (a stream this time).
	if _, _, err := count(conn, plan("f", "free"), 1); err != nil {
		t.Fatal(err)
	}
	_, tr, err = count(conn, plan("f", "free"), 1)
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted {
		t.Fatalf("free, second call: %v", err)
	}
	if got := tr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"default";q=1;w=60` {
		t.Fatalf("free ratelimit-policy %v", got)
	}
	// No tier: the limiter's own limit.
	tr = nil
	if _, err := unary(conn, withKey("n"), &tr); err != nil || tr.Get("ratelimit-policy")[0] != `"default";q=100;w=60` {
		t.Fatalf("no tier: %v %v", err, tr)
	}
	// An unknown tier is a limiter error: logged, and codes.Internal with a
	// fixed message (the tier, from the caller's metadata, is not echoed).
	var logged lockedBuffer
	prev := log.Writer()
	log.SetOutput(&logged)
	defer log.SetOutput(prev)
	_, err = unary(conn, plan("g", "gold"), new(metadata.MD))
	if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != "rate limiter error" {
		t.Fatalf("unknown tier: %v", err)
	}
	if !strings.Contains(logged.String(), `unknown tier "gold"`) {
		t.Fatalf("unknown tier, logged: %q", logged.String())
	}
	if strings.Join(methods[:2], ",") != "/test.Echo/Unary,/test.Echo/Count" {
		t.Fatalf("the tier function sees the method: %v", methods)
	}
}

// lockedBuffer takes the server goroutines' log lines while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WithWait: the third call on a 2/s key waits for the refill instead of
// RESOURCE_EXHAUSTED.
func TestWithWaitWaitsForTheRefill(t *testing.T) {
	cfg := quotalease.DefaultConfig()
	cfg.Limit, cfg.WindowMs, cfg.LeaseSize = 2, 1000, 1
	lim, err := quotalease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	conn := serve(t, grpc.ChainUnaryInterceptor(
		grpcrl.UnaryServerInterceptor(lim, grpcrl.ByMetadata("x-api-key"), grpcrl.WithWait(30*time.Second))))
	for i := 0; i < 3; i++ {
		if _, err := unary(conn, withKey("k"), new(metadata.MD)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if m := lim.Metrics(); m.Admitted != 3 || m.Denied != 0 {
		t.Fatalf("metrics %+v", m)
	}
}
