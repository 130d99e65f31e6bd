#!/usr/bin/env bash
# Go tests (`make test-go`): liblease is installed into target/lease-prefix
# ($CARGO_TARGET_DIR/lease-prefix when that is set)
# (found through its lease.pc), then gofmt, go vet, every `package main`
# example of the README (the quick start, gRPC, OpenTelemetry), and
# `go test -race` of bindings/go: conformance vectors on memory and a real
# Redis, Redis integration with events, bad input, the net/http middleware;
# then of the modules beside it, grpcrl (gRPC interceptors on a real server)
# and otelrl (OpenTelemetry, the SDK's ManualReader).
# Ends with "Go: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash scripts/ensure-redis.sh
if ! command -v go >/dev/null; then
  echo "error: Go is missing: install Go >= 1.19 (https://go.dev/doc/install, or Debian's golang-go)" >&2
  exit 1
fi
export GOTOOLCHAIN=local   # never download a toolchain
export CGO_ENABLED=1

prefix="${CARGO_TARGET_DIR:-$root/target}/lease-prefix"
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"

cd bindings/go
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "error: gofmt would change: $unformatted (run gofmt -w bindings/go)" >&2
  exit 1
fi
go vet ./...
# Modules of their own (they need grpc / OpenTelemetry; the core module needs nothing).
submodules="grpcrl otelrl"
for sub in $submodules; do (cd "$sub" && go vet ./...); done

passed=0
failed=0
# Every `package main` example of bindings/go/README.md and of the project
# README.md (its Go quick start), each in a fresh module that points at this checkout.
work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-go.XXXXXX")
trap 'rm -rf "$work"' EXIT
awk -v dir="$work" '/^```go$/{n++; p=1; f=dir "/block" n ".go"; next} p&&/^```$/{p=0; next} p{print > f}' \
  "$root/bindings/go/README.md" "$root/README.md"
examples=0
for block in "$work"/block*.go; do
  [ -e "$block" ] || continue
  head -n1 "$block" | grep -q '^package main$' || continue
  examples=$((examples + 1))
  ex="$work/example$examples"
  mkdir -p "$ex"
  cp "$block" "$ex/main.go"
  echo "== README example $examples (go run)"
  if (cd "$ex" && go mod init example.com/app >/dev/null 2>&1 &&
      go mod edit -require=github.com/quotalease/quotalease/bindings/go@v0.0.0 \
        -replace=github.com/quotalease/quotalease/bindings/go="$root/bindings/go" \
        -replace=github.com/quotalease/quotalease/bindings/go/grpcrl="$root/bindings/go/grpcrl" \
        -replace=github.com/quotalease/quotalease/bindings/go/otelrl="$root/bindings/go/otelrl" &&
      { go mod tidy >tidy.log 2>&1 || { cat tidy.log; false; }; } && go run .); then
    passed=$((passed + 1))
  else
    echo "FAILED: README example $examples"
    failed=$((failed + 1))
  fi
done
if [ "$examples" = 0 ]; then
  echo "FAILED: no \`\`\`go block with package main in bindings/go/README.md or README.md"
  failed=$((failed + 1))
fi

log="$work/go-test.log"
set +e
go test -race -count=1 -v ./... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
for sub in $submodules; do
  (cd "$sub" && go test -race -count=1 -v ./...) 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
set -e
passed=$((passed + $(grep -cE '^\s*--- PASS' "$log" || true)))
failed=$((failed + $(grep -cE '^\s*--- FAIL' "$log" || true)))
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
  failed=1   # a build failure or a crash
fi
echo "Go: $passed passed, $failed failed"
[ "$failed" = 0 ]
