// Case (b) of make bench-fleet, the Go side (see ../fleet.py):
//
//	fleetgo serve -url U -prefix P -limit N -window MS [-lease N] -port N -out DIR
//
// is a net/http server behind quotalease's middleware, every request limited
// on the one key "fleet" (/health is not limited); several such processes
// share a port with SO_REUSEPORT. It writes DIR/ready-go-PID when it serves and,
// on SIGTERM, DIR/go-PID.json (the same record as ../app.py).
//
//	fleetgo load -targets name=URL,... -rate R -duration S -conns C -start-at MS
//
// offers R requests per second in total, split evenly over the targets, each
// over C keep-alive connections paced by a schedule (request i of a connection
// is due at a fixed time, so what is offered does not depend on the answers),
// from the wall-clock time start-at for S seconds, and prints one JSON line:
// per target the requests sent and the 200, 429 and other answers.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	quotalease "github.com/quotalease/quotalease/bindings/go"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fleetgo serve|load [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "load":
		load(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: fleetgo serve|load [flags]")
		os.Exit(2)
	}
}

// soReusePort is SO_REUSEPORT on Linux x86 and arm (the syscall package does not
// name it): several server processes accept on one port, the kernel spreads
// the connections.
const soReusePort = 0xf

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fleetgo:", err)
	os.Exit(1)
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	url := fs.String("url", "", "Redis URL")
	prefix := fs.String("prefix", "", "key_prefix")
	limit := fs.Uint64("limit", 0, "tokens per window")
	window := fs.Uint64("window", 1000, "window in ms")
	lease := fs.Uint64("lease", 0, "lease_size (0: adaptive leasing)")
	port := fs.Int("port", 0, "port on 127.0.0.1 (shared with SO_REUSEPORT)")
	out := fs.String("out", "", "directory for the ready file and the record")
	_ = fs.Parse(args)

	cfg := quotalease.DefaultConfig()
	cfg.URL, cfg.KeyPrefix, cfg.Limit, cfg.WindowMs = *url, *prefix, *limit, *window
	cfg.LeaseSize = *lease
	if *lease == 0 {
		cfg.LeaseSize = quotalease.Auto
	}
	lim, err := quotalease.New(cfg)
	if err != nil {
		fail(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	key := func(r *http.Request) string {
		if r.URL.Path == "/health" {
			return ""
		}
		return "fleet"
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soReusePort, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		fail(err)
	}
	srv := &http.Server{Handler: quotalease.Middleware(lim, key)(ok)}

	var mu sync.Mutex
	perSecond := [][3]uint64{} // [unix second, backend_calls, admitted] at each whole second
	stop := make(chan struct{})
	go func() {
		for {
			now := time.Now()
			select {
			case <-stop:
				return
			case <-time.After(now.Truncate(time.Second).Add(time.Second).Sub(now)):
			}
			m := lim.Metrics()
			mu.Lock()
			perSecond = append(perSecond, [3]uint64{uint64(time.Now().Round(time.Second).Unix()), m.BackendCalls, m.Admitted})
			mu.Unlock()
		}
	}()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		if err := srv.Serve(ln); err != http.ErrServerClosed {
			fail(err)
		}
	}()
	pid := os.Getpid()
	if err := os.WriteFile(filepath.Join(*out, fmt.Sprintf("ready-go-%d", pid)), nil, 0o644); err != nil {
		fail(err)
	}
	<-term
	close(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	run := lim.Metrics().Map()
	if err := lim.Close(); err != nil {
		fail(err)
	}
	mu.Lock()
	rec, _ := json.Marshal(map[string]any{
		"lang": "go", "pid": pid, "metrics": run, "metrics_closed": lim.Metrics().Map(), "per_second": perSecond,
	})
	mu.Unlock()
	if err := os.WriteFile(filepath.Join(*out, fmt.Sprintf("go-%d.json", pid)), rec, 0o644); err != nil {
		fail(err)
	}
}

type counts struct {
	Sent    int64 `json:"sent"`
	OK      int64 `json:"ok"`
	Limited int64 `json:"limited"`
	Other   int64 `json:"other"`
	Errors  int64 `json:"errors"`
}

func load(args []string) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	targets := fs.String("targets", "", "name=URL,name=URL,...")
	rate := fs.Float64("rate", 0, "requests per second offered in total")
	duration := fs.Float64("duration", 20, "seconds")
	conns := fs.Int("conns", 16, "keep-alive connections per target")
	startAt := fs.Int64("start-at", 0, "wall-clock start in unix ms (0: now)")
	_ = fs.Parse(args)

	type target struct {
		name, url string
		c         counts
	}
	var ts []*target
	for _, t := range strings.Split(*targets, ",") {
		name, url, found := strings.Cut(t, "=")
		if !found {
			fail(fmt.Errorf("bad target %q (want name=URL)", t))
		}
		ts = append(ts, &target{name: name, url: url})
	}
	start := time.Now()
	if *startAt > 0 {
		start = time.UnixMilli(*startAt)
	}
	end := start.Add(time.Duration(*duration * float64(time.Second)))
	perConn := *rate / float64(len(ts)) / float64(*conns) // requests per second on one connection
	var first, last atomic.Int64
	var wg sync.WaitGroup
	for _, t := range ts {
		for k := 0; k < *conns; k++ {
			wg.Add(1)
			go func(t *target, k int) {
				defer wg.Done()
				client := &http.Client{
					Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true},
					Timeout:   10 * time.Second,
				}
				for i := 0; ; i++ {
					due := start.Add(time.Duration((float64(i) + float64(k)/float64(*conns)) / perConn * float64(time.Second)))
					if !due.Before(end) {
						return
					}
					time.Sleep(time.Until(due))
					sent := time.Now().UnixMilli()
					first.CompareAndSwap(0, sent)
					atomic.AddInt64(&t.c.Sent, 1)
					resp, err := client.Get(t.url)
					if err != nil {
						atomic.AddInt64(&t.c.Errors, 1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						atomic.AddInt64(&t.c.OK, 1)
					case http.StatusTooManyRequests:
						atomic.AddInt64(&t.c.Limited, 1)
					default:
						atomic.AddInt64(&t.c.Other, 1)
					}
					for now := time.Now().UnixMilli(); ; {
						l := last.Load()
						if now <= l || last.CompareAndSwap(l, now) {
							break
						}
					}
				}
			}(t, k)
		}
	}
	wg.Wait()
	res := map[string]counts{}
	for _, t := range ts {
		res[t.name] = t.c
	}
	out, _ := json.Marshal(map[string]any{"targets": res, "first_ms": first.Load(), "last_ms": last.Load()})
	fmt.Println(string(out))
}
