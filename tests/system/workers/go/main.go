// Go worker of the cross-language system test (see ../../README.md).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	quotalease "github.com/quotalease/quotalease/bindings/go"
)

type job struct {
	URL              string   `json:"url"`
	KeyPrefix        string   `json:"key_prefix"`
	Keys             []string `json:"keys"`
	Weights          []int    `json:"weights"`
	PauseUs          int64    `json:"pause_us"`
	Limit            uint64   `json:"limit"`
	WindowMs         uint64   `json:"window_ms"`
	LeaseSize        uint64   `json:"lease_size"`
	OnBackendFailure string   `json:"on_backend_failure"`
	ExpectedReplicas uint64   `json:"expected_replicas"`
	BackendTimeoutMs uint64   `json:"backend_timeout_ms"`
	StartAtMs        int64    `json:"start_at_ms"`
	DurationMs       int64    `json:"duration_ms"`
	SlotMs           int64    `json:"slot_ms"`
	SettleMs         int64    `json:"settle_ms"`
	ProgressMs       int64    `json:"progress_ms"` // optional: a progress line every progress_ms
}

// One timeline cell: decisions for a key in one slot of slot_ms, by reason.
type cell struct {
	slot        int64
	key, reason string
}

func main() {
	var j job
	if err := json.Unmarshal([]byte(os.Args[1]), &j); err != nil {
		fmt.Fprintln(os.Stderr, "worker_go: bad job:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	events := []string{}
	cfg := quotalease.DefaultConfig()
	cfg.URL = j.URL
	cfg.KeyPrefix = j.KeyPrefix
	cfg.Limit = j.Limit
	cfg.WindowMs = j.WindowMs
	cfg.LeaseSize = j.LeaseSize
	cfg.OnBackendFailure = quotalease.FailurePolicy(j.OnBackendFailure)
	cfg.ExpectedReplicas = j.ExpectedReplicas
	cfg.BackendTimeoutMs = j.BackendTimeoutMs
	cfg.OnEvent = func(e quotalease.Event) {
		mu.Lock()
		events = append(events, string(e.Kind))
		mu.Unlock()
	}
	l, err := quotalease.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker_go:", err)
		os.Exit(1)
	}
	var schedule []string
	for i, k := range j.Keys {
		for w := 0; w < j.Weights[i]; w++ {
			schedule = append(schedule, k)
		}
	}
	start := time.UnixMilli(j.StartAtMs)
	end := start.Add(time.Duration(j.DurationMs) * time.Millisecond)
	time.Sleep(time.Until(start))
	settleEnd := end.Add(time.Duration(j.SettleMs) * time.Millisecond)
	admitted := map[string]uint64{}
	reasons := map[string]uint64{}
	timeline := map[cell]*[2]uint64{}
	var maxMs int64
	nextProgress := start
	var progress []byte // reused: a progress line leaves no garbage behind
	for i := 0; ; i++ {
		t := time.Now()
		// Past the deadline, go on while degraded: recovery is awaited, not timed.
		if !t.Before(settleEnd) || (!t.Before(end) && l.Metrics().FallbackActive == 0) {
			break
		}
		if j.ProgressMs > 0 && !t.Before(nextProgress) {
			progress = progressLine(progress[:0], t, l.Metrics(), reasons)
			os.Stdout.Write(progress)
			nextProgress = t.Add(time.Duration(j.ProgressMs) * time.Millisecond)
		}
		key := schedule[i%len(schedule)]
		d, err := l.Acquire(key)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker_go: acquire:", err)
			os.Exit(1)
		}
		if ms := time.Since(t).Milliseconds(); ms > maxMs {
			maxMs = ms
		}
		reasons[string(d.Reason)]++
		c := cell{t.Sub(start).Milliseconds() / j.SlotMs, key, string(d.Reason)}
		if timeline[c] == nil {
			timeline[c] = &[2]uint64{}
		}
		if d.Allowed {
			admitted[key]++
			timeline[c][0]++
		} else {
			timeline[c][1]++
		}
		if j.PauseUs > 0 {
			time.Sleep(time.Duration(j.PauseUs) * time.Microsecond)
		}
	}
	endedAt := time.Now().UnixMilli()
	closed := l.Close() == nil
	cells := [][]any{}
	for c, n := range timeline {
		cells = append(cells, []any{c.slot, c.key, c.reason, n[0], n[1]})
	}
	mu.Lock()
	seen := append([]string{}, events...)
	mu.Unlock()
	out, _ := json.Marshal(map[string]any{
		"lang": "go", "admitted": admitted, "reasons": reasons, "metrics": l.Metrics().Map(),
		"events": seen, "closed": closed, "max_acquire_ms": maxMs,
		"ended_at_ms": endedAt, "timeline": cells,
	})
	fmt.Println(string(out))
}

// progressLine appends one progress line (tests/system/README.md) to buf.
// It allocates nothing once buf has grown, so a long soak measures the
// library's memory, not garbage the Go collector has not been asked to
// collect yet (a worker this quiet stays under the first GC's 4 MB heap
// goal for many minutes).
func progressLine(buf []byte, t time.Time, m quotalease.Metrics, reasons map[string]uint64) []byte {
	buf = append(buf, `{"progress_at_ms": `...)
	buf = strconv.AppendInt(buf, t.UnixMilli(), 10)
	buf = append(buf, `, "fallback_active": `...)
	buf = strconv.AppendUint(buf, m.FallbackActive, 10)
	buf = append(buf, `, "fallback_transitions": `...)
	buf = strconv.AppendUint(buf, m.FallbackTransitions, 10)
	buf = append(buf, `, "reasons": {`...)
	sep := ""
	for r, n := range reasons {
		buf = append(buf, sep...)
		buf = strconv.AppendQuote(buf, r)
		buf = append(buf, `: `...)
		buf = strconv.AppendUint(buf, n, 10)
		sep = ", "
	}
	return append(buf, "}}\n"...)
}
