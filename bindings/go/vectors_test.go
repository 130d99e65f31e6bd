package quotalease

// The conformance-vector runner (format: tests/vectors/README.md), against
// the in-memory authority and a real redis-server.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type vector struct {
	Name      string           `json:"name"`
	Config    map[string]any   `json:"config"`
	Instances *int             `json:"instances"`
	Steps     []map[string]any `json:"steps"`
}

func u64(t *testing.T, v any, what string) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%s must be a number, got %v", what, v)
	}
	u, err := strconv.ParseUint(string(n), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return u
}

// vectorOptions are a vector's config as options by name, exactly as the
// vector spells them (the engine checks names, values and rules), after a
// unique url and key_prefix and the manual clock (it starts at 1000000 ms,
// the engine's default).
func vectorOptions(t *testing.T, fields map[string]any, url, prefix string) []option {
	opts := []option{
		{name: "url", str: url, isStr: true},
		{name: "key_prefix", str: prefix, isStr: true},
		{name: "clock", str: "manual", isStr: true},
	}
	for k, v := range fields {
		if s, ok := v.(string); ok {
			opts = append(opts, option{name: k, str: s, isStr: true})
		} else {
			opts = append(opts, option{name: k, num: u64(t, v, k)})
		}
	}
	return opts
}

func vectorKey(t *testing.T, step map[string]any) string {
	switch k := step["key"].(type) {
	case string:
		return k
	case map[string]any:
		return strings.Repeat(k["repeat"].(string), int(u64(t, k["times"], "times")))
	}
	return "k"
}

func kindOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind.String()
	}
	return fmt.Sprintf("not an *Error: %v", err)
}

func checkDecision(d Decision, expect map[string]any) error {
	for k, v := range expect {
		var got, want string
		switch k {
		case "allowed":
			got, want = strconv.FormatBool(d.Allowed), strconv.FormatBool(v.(bool))
		case "reason":
			got, want = string(d.Reason), v.(string)
		case "limit", "remaining", "retry_after_ms", "reset_after_ms", "window_ms", "rule":
			n := map[string]uint64{"limit": d.Limit, "remaining": d.Remaining, "retry_after_ms": d.RetryAfterMs,
				"reset_after_ms": d.ResetAfterMs, "window_ms": d.WindowMs, "rule": uint64(d.Rule)}[k]
			got, want = strconv.FormatUint(n, 10), string(v.(json.Number))
		default:
			return fmt.Errorf("unknown decision field %s", k)
		}
		if got != want {
			return fmt.Errorf("field %s: got %s, want %s (decision %+v)", k, got, want, d)
		}
	}
	return nil
}

func runVector(t *testing.T, path, backend, redis string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v vector
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	prefix := uniq("v")
	url := redis
	if url == "" {
		url = "memory://" + v.Name + "-" + prefix
	}
	n := 1
	if v.Instances != nil {
		n = *v.Instances
	}
	ls := make([]*Limiter, n)
	for i := range ls {
		l, err := newLimiter(vectorOptions(t, v.Config, url, prefix), nil)
		if err != nil {
			t.Fatalf("%s: instance %d: %v", v.Name, i, err)
		}
		t.Cleanup(func() { l.Close() })
		ls[i] = l
	}
	settle := func(ctx string) {
		for _, l := range ls {
			if err := l.Settle(); err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("%s: settle: %v", ctx, err)
			}
		}
	}
	checked := 0
	for i, step := range v.Steps {
		if only, ok := step["only"].(string); ok && only != backend {
			continue
		}
		op := step["op"].(string)
		ctx := fmt.Sprintf("%s [%s] step %d (%s)", v.Name, backend, i, op)
		l := ls[0]
		if inst, ok := step["instance"]; ok {
			l = ls[u64(t, inst, "instance")]
		}
		cost := uint64(1)
		if c, ok := step["cost"]; ok {
			cost = u64(t, c, "cost")
		}
		expectErr, _ := step["expect_error"].(string)
		tier, _ := step["tier"].(string)
		str := func(field string) string {
			s, ok := step[field].(string)
			if !ok {
				t.Fatalf("%s: %s must be a string", ctx, field)
			}
			return s
		}
		expect, _ := step["expect"].(map[string]any)
		var outcome *struct {
			d   Decision
			err error
		}
		switch op {
		case "acquire", "try_acquire":
			var d Decision
			var err error
			switch {
			case op == "acquire" && tier != "":
				d, err = l.AcquireTierN(vectorKey(t, step), cost, tier)
			case op == "acquire":
				d, err = l.AcquireN(vectorKey(t, step), cost)
			case tier != "":
				d, err = l.TryAcquireTierN(vectorKey(t, step), cost, tier)
			default:
				d, err = l.TryAcquireN(vectorKey(t, step), cost)
			}
			outcome = &struct {
				d   Decision
				err error
			}{d, err}
		case "acquire_n":
			allowed, denied := uint64(0), uint64(0)
			for k := uint64(0); k < u64(t, step["count"], "count"); k++ {
				d, err := l.AcquireTierN(vectorKey(t, step), cost, tier)
				if err != nil {
					t.Fatalf("%s: %v", ctx, err)
				}
				if d.Allowed {
					allowed++
				} else {
					denied++
				}
				settle(ctx)
			}
			if allowed != u64(t, expect["allowed"], "allowed") || denied != u64(t, expect["denied"], "denied") {
				t.Errorf("%s: allowed %d denied %d, want %v", ctx, allowed, denied, expect)
			}
		case "advance":
			for _, l := range ls {
				if err := l.AdvanceClock(u64(t, step["ms"], "ms")); err != nil {
					t.Fatalf("%s: %v", ctx, err)
				}
			}
		case "settle":
		case "set_limit":
			err := l.SetLimit(vectorKey(t, step), u64(t, step["limit"], "limit"), u64(t, step["window_ms"], "window_ms"))
			if expectErr != "" && kindOf(err) != expectErr || expectErr == "" && err != nil {
				t.Errorf("%s: got %v, want %q", ctx, err, expectErr)
			}
		case "policy_set_tier", "policy_delete_tier", "policy_assign", "policy_unassign":
			// The shared store; the settle below refreshes every instance.
			var err error
			switch op {
			case "policy_set_tier":
				_, err = l.PolicySetTier(str("name"), str("rules"))
			case "policy_delete_tier":
				_, err = l.PolicyDeleteTier(str("name"))
			case "policy_assign":
				_, err = l.PolicyAssign(vectorKey(t, step), str("assignment"))
			default:
				_, err = l.PolicyUnassign(vectorKey(t, step))
			}
			if expectErr != "" && kindOf(err) != expectErr || expectErr == "" && err != nil {
				t.Errorf("%s: got %v, want %q", ctx, err, expectErr)
			}
		case "flush":
			if err := l.Flush(); err != nil {
				t.Errorf("%s: %v", ctx, err)
			}
		case "close":
			if err := l.Close(); err != nil {
				t.Errorf("%s: %v", ctx, err)
			}
		case "metrics":
			got := l.Metrics().Map()
			for k, want := range expect {
				g, ok := got[k]
				if !ok || strconv.FormatUint(g, 10) != string(want.(json.Number)) {
					t.Errorf("%s: metric %s = %d, want %v", ctx, k, g, want)
				}
			}
		case "new":
			fields := map[string]any{}
			for k, x := range v.Config {
				fields[k] = x
			}
			for k, x := range step["config"].(map[string]any) {
				fields[k] = x
			}
			extra, err := newLimiter(vectorOptions(t, fields, url, prefix), nil)
			if err == nil {
				extra.Close()
			}
			if kindOf(err) != expectErr {
				t.Errorf("%s: got %v, want %s", ctx, err, expectErr)
			}
		default:
			t.Fatalf("%s: unknown op", ctx)
		}
		if outcome != nil {
			switch {
			case expectErr != "":
				if kindOf(outcome.err) != expectErr {
					t.Errorf("%s: got %+v / %v, want error %s", ctx, outcome.d, outcome.err, expectErr)
				}
			case outcome.err != nil:
				t.Errorf("%s: unexpected error %v", ctx, outcome.err)
			default:
				if err := checkDecision(outcome.d, expect); err != nil {
					t.Errorf("%s: %v", ctx, err)
				}
			}
		}
		settle(ctx)
		checked++
	}
	return checked
}

func vectorFiles(t *testing.T) []string {
	files, err := filepath.Glob("../../tests/vectors/*.json")
	if err != nil || len(files) < 15 {
		t.Fatalf("expected at least 15 vectors, found %d (%v)", len(files), err)
	}
	return files
}

func runVectors(t *testing.T, backend, url string) {
	steps := 0
	for _, f := range vectorFiles(t) {
		f := f
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			steps += runVector(t, f, backend, url)
		})
	}
	if steps <= 100 {
		t.Fatalf("only %d steps ran", steps)
	}
	t.Logf("%d steps checked against %s", steps, backend)
}

func TestVectorsMemory(t *testing.T) { runVectors(t, "memory", "") }

func TestVectorsRedis(t *testing.T) { runVectors(t, "redis", redisURL(t)) }
