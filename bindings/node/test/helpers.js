'use strict'
// Shared by the tests: real redis-server processes through the project's one
// harness script (tests/harness/redisctl), and bounded polling.

const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')

const REPO = path.resolve(__dirname, '..', '..', '..')
const REDISCTL = path.join(REPO, 'tests', 'harness', 'redisctl')

// Each test file (one process under node --test) gets its own harness state,
// so suites running side by side never stop each other's servers.
const STATE = fs.mkdtempSync(path.join(os.tmpdir(), 'quotalease-node-test-'))
const harnessEnv = { ...process.env, TMPDIR: STATE, QUOTALEASE_HARNESS_STATE: path.join(STATE, 'index') }

function redisctl(...args) {
  try {
    return execFileSync(REDISCTL, args.map(String), { env: harnessEnv, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()
  } catch (err) {
    throw new Error(
      `redisctl ${args.join(' ')} failed: ${err.stderr || err.message}\n` +
        '(is redis-server installed? `make test` installs it; or `apt-get install redis-server`)',
    )
  }
}

/** A real redis-server on a free loopback port. */
class RedisServer {
  constructor() {
    this.port = Number(redisctl('start'))
    this.url = `redis://127.0.0.1:${this.port}`
  }
  stop() {
    redisctl('stop', this.port)
  }
  kill() {
    redisctl('kill', this.port)
  }
  pause() {
    redisctl('pause', this.port)
  }
  resume() {
    redisctl('resume', this.port)
  }
  restart() {
    redisctl('restart', this.port)
  }
  cli(...args) {
    return execFileSync('redis-cli', ['-p', String(this.port), ...args.map(String)], { encoding: 'utf8' }).trim()
  }
}

process.on('exit', () => {
  try {
    execFileSync(REDISCTL, ['stop-all'], { env: harnessEnv, stdio: 'ignore' })
  } catch {}
  fs.rmSync(STATE, { recursive: true, force: true })
})

let n = 0
/** A name no other test of this run uses. */
function unique(prefix) {
  n += 1
  return `${prefix}${process.pid}x${n}x${Date.now()}`
}

/** Poll `cond` until it holds; the deadline is a hang guard, not a timing assertion. */
async function waitFor(what, cond, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await cond()) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

/** `handler` served on a free loopback port: its base URL and a close(). */
function listen(handler) {
  return new Promise((resolve) => {
    const server = http.createServer(handler)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      resolve({ base: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(r)) })
    })
  })
}

module.exports = { RedisServer, redisctl, listen, unique, waitFor, REPO, harnessEnv }
