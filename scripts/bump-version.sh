#!/usr/bin/env bash
# scripts/bump-version.sh X.Y.Z: set the one version of every artifact
# (Cargo.toml and Cargo.lock, ffi/src/version.rs and include/lease.h through
# cbindgen, every quotalease package.json with its optionalDependencies, the
# package-lock, the napi loader's expected version), open the CHANGELOG
# section for it, then check that every place agrees. Review `git diff` and
# commit (RELEASING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ]; then
  echo "usage: scripts/bump-version.sh X.Y.Z" >&2
  exit 2
fi
new=$1
python3 scripts/versions.py bump "$new"
scripts/check-header.sh --update
# Keep a Changelog: what is under [Unreleased] becomes the X.Y.Z section.
if ! grep -q "^## \[$new\]" CHANGELOG.md; then
  python3 - "$new" <<'PY'
import datetime, re, sys
new = sys.argv[1]
text = open("CHANGELOG.md").read()
today = datetime.date.today().isoformat()
text, n = re.subn(r"(?m)^## \[Unreleased\]\n", f"## [Unreleased]\n\n## [{new}] - {today}\n", text, count=1)
if n != 1:
    sys.exit("error: CHANGELOG.md has no '## [Unreleased]' heading")
open("CHANGELOG.md", "w").write(text)
PY
fi
bash scripts/check-versions.sh >/dev/null
echo "version $new set everywhere; next: review git diff, update CHANGELOG.md, commit, then RELEASING.md"
