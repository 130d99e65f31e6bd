'use strict'
// A server that accepts connections and never answers (a listener nobody
// reads): a cold acquire waits one backendTimeoutMs in all, connect
// included, then the failure policy decides (it once waited two).

const test = require('node:test')
const assert = require('node:assert/strict')
const net = require('node:net')

const { Limiter } = require('..')

async function blackHole () {
  const held = []
  const server = net.createServer((socket) => held.push(socket))
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: server.address().port,
    close: () => {
      for (const s of held) s.destroy()
      server.close()
    }
  }
}

for (const [name, call] of [
  ['acquire', (l) => l.acquire('k')],
  ['acquireSync', (l) => l.acquireSync('k')]
]) {
  test(`${name} on a black hole costs one backendTimeoutMs`, async () => {
    const hole = await blackHole()
    const l = new Limiter({ url: `redis://127.0.0.1:${hole.port}`, rate: '600/min', backendTimeoutMs: 1000 })
    try {
      const start = performance.now()
      const d = await call(l)
      const waited = performance.now() - start
      // a first silence: denied as pending (the server may only be slow);
      // the failure policy decides once the silence lasts a timeout more
      assert.deepEqual([d.allowed, d.reason], [false, 'pending'])
      assert.ok(waited < 2000, `waited ${waited.toFixed(0)} ms: more than one backendTimeoutMs (1000)`)
    } finally {
      await l.close()
      hole.close()
    }
  })
}
