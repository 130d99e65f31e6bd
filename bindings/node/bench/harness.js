'use strict'
// What the Node benchmarks share: their command-line options, a redis-server
// of their own, and writing their block of docs/benchmarks.md.

const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const REPO = path.resolve(__dirname, '..', '..', '..')

/** `opt('--name', default)`: the value after `--name` in argv, else the default. */
function options (argv = process.argv.slice(2)) {
  return (name, dflt) => {
    const i = argv.indexOf(name)
    return i >= 0 ? argv[i + 1] : dflt
  }
}

/**
 * `tests/harness/redisctl` with a private harness index (a temp dir made on
 * first use), so no other suite's stop-all touches the benchmark's server.
 * `redisctl.cleanup()` removes that dir.
 */
function privateRedisctl (tag) {
  let state = null
  const redisctl = (...a) => {
    state = state || fs.mkdtempSync(path.join(os.tmpdir(), `quotalease-${tag}-`))
    const env = { ...process.env, TMPDIR: state, QUOTALEASE_HARNESS_STATE: path.join(state, 'index') }
    return execFileSync(path.join(REPO, 'tests', 'harness', 'redisctl'), a, { env, encoding: 'utf8' }).trim()
  }
  redisctl.cleanup = () => {
    if (state) fs.rmSync(state, { recursive: true, force: true })
    state = null
  }
  return redisctl
}

/**
 * Replace the block between `<!-- NAME:start -->` and `<!-- NAME:end -->` of
 * the file at `docsPath` with `lines` (markers added), re-reading the file
 * right before writing (other benches edit their own blocks of it). Without
 * the block yet: insert it after the line holding `after`, or append it
 * under `heading`.
 */
function writeBlock (docsPath, name, lines, { after = null, heading = null } = {}) {
  const start = `<!-- ${name}:start -->`
  const end = `<!-- ${name}:end -->`
  const block = [start, ...lines, end].join('\n')
  let text = fs.readFileSync(docsPath, 'utf8')
  const a = text.indexOf(start)
  const b = text.indexOf(end)
  const at = after === null ? -1 : text.indexOf(after)
  if (a >= 0 && b > a) {
    text = text.slice(0, a) + block + text.slice(b + end.length)
  } else if (at >= 0) {
    const eol = text.indexOf('\n', at)
    const cut = eol >= 0 ? eol + 1 : text.length
    text = text.slice(0, cut) + '\n' + block + '\n' + (text.slice(cut).startsWith('\n') ? '' : '\n') + text.slice(cut)
  } else {
    text = text.trimEnd() + '\n\n' + (heading ? `${heading}\n\n` : '') + block + '\n'
  }
  fs.writeFileSync(docsPath, text)
}

module.exports = { REPO, options, privateRedisctl, writeBlock }
