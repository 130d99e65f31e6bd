#!/usr/bin/env bash
# Go tests (`make test-go`): liblease is installed into target/lease-prefix
# (found through its lease.pc), then gofmt, go vet, the README quick start,
# and `go test -race` of bindings/go: conformance vectors on memory and a real
# Redis, Redis integration with events, bad input, the net/http middleware.
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

prefix="$root/target/lease-prefix"
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"

cd bindings/go
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "error: gofmt would change: $unformatted (run gofmt -w bindings/go)" >&2
  exit 1
fi
go vet ./...

passed=0
failed=0
# The README quick start (bindings/go/README.md), in a fresh module that points at this checkout.
work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-go.XXXXXX")
trap 'rm -rf "$work"' EXIT
awk '/^```go$/{p=1;next} p&&/^```$/{exit} p' "$root/bindings/go/README.md" > "$work/main.go"
if [ -s "$work/main.go" ]; then
  echo "== README quick start (go run)"
  if (cd "$work" && go mod init example.com/app >/dev/null 2>&1 &&
      go mod edit -require=github.com/quotalease/quotalease/bindings/go@v0.0.0 \
        -replace=github.com/quotalease/quotalease/bindings/go="$root/bindings/go" &&
      go run .); then
    passed=$((passed + 1))
  else
    echo "FAILED: README quick start"
    failed=$((failed + 1))
  fi
else
  echo "FAILED: no \`\`\`go block in bindings/go/README.md"
  failed=$((failed + 1))
fi

log="$work/go-test.log"
set +e
go test -race -count=1 -v ./... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$((passed + $(grep -cE '^\s*--- PASS' "$log" || true)))
failed=$((failed + $(grep -cE '^\s*--- FAIL' "$log" || true)))
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
  failed=1   # a build failure or a crash
fi
echo "Go: $passed passed, $failed failed"
[ "$failed" = 0 ]
