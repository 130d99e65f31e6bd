'use strict'
// The package README's examples (bindings/node/README.md) work when copied:
// the JavaScript ones run, the TypeScript one type-checks. So does the project
// README's Node example (README.md at the root of the repository).

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn, execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const PKG = path.resolve(__dirname, '..')
// Inside the package, so `require('quotalease')` resolves to it by its own name.
const DIR = path.join(__dirname, '.readme')

function blocks() {
  const readme = fs.readFileSync(path.join(PKG, 'README.md'), 'utf8')
  return [...readme.matchAll(/```(js|ts)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1], code: m[2] }))
}

// The first ```js block under `### <heading>` of the project README (README.md at the root).
function projectReadmeBlock(heading = 'Node') {
  const readme = fs.readFileSync(path.join(PKG, '..', '..', 'README.md'), 'utf8')
  const section = readme.match(new RegExp(`^### ${heading}\\n([\\s\\S]*?)(?=^##)`, 'm'))
  assert.ok(section, `the project README has no '### ${heading}' section`)
  const block = section[1].match(/```js\n([\s\S]*?)```/)
  assert.ok(block, `the project README's '### ${heading}' section has no \`\`\`js block`)
  return block[1]
}

function write(name, code) {
  fs.mkdirSync(DIR, { recursive: true })
  const file = path.join(DIR, name)
  fs.writeFileSync(file, code)
  return file
}

function run(file, env = {}) {
  const child = spawn(process.execPath, [file], { cwd: DIR, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  child.out = ''
  child.err = ''
  child.stdout.on('data', (b) => (child.out += b))
  child.stderr.on('data', (b) => (child.err += b))
  child.exited = new Promise((resolve, reject) => {
    const guard = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`${file} did not exit by itself\n${child.out}\n${child.err}`))
    }, 30000)
    child.on('exit', (status) => {
      clearTimeout(guard)
      resolve(status)
    })
  })
  return child
}

const all = blocks()
test.after(() => fs.rmSync(DIR, { recursive: true, force: true }))

test('the README has the quick start, the Express examples in JS and TS, Fastify, tiers and the store, Express with tiers, OpenTelemetry, behind a proxy, reserve, then settle, and concurrency limits', () => {
  assert.deepEqual(all.map((b) => b.lang), ['js', 'js', 'ts', 'js', 'js', 'js', 'js', 'js', 'js', 'js'])
})

test('the quick start runs', async () => {
  const child = run(write('quickstart.js', all[0].code))
  assert.equal(await child.exited, 0, child.err)
  const lines = child.out.trim().split('\n')
  assert.deepEqual(lines.slice(0, 6), ['0 true 4 lease', '1 true 3 lease', '2 true 2 lease', '3 true 1 lease', '4 true 0 lease', '5 false 0 exhausted'])
  assert.match(child.out, /reason: 'exhausted'/)
  assert.match(child.out, /'Retry-After': '\d+'/)
})

test('the Express example serves with RateLimit headers and exits on SIGTERM', async () => {
  const child = run(write('express-app.js', all[1].code), { PORT: '0' })
  let url
  const deadline = Date.now() + 30000
  while (!(url = (child.out.match(/listening on (\S+)/) || [])[1])) {
    assert.ok(Date.now() < deadline, `the example did not start: ${child.err}`)
    await new Promise((r) => setTimeout(r, 20))
  }
  const r = await fetch(url, { headers: { 'x-api-key': 'k1' } })
  assert.equal(r.status, 200)
  assert.deepEqual(await r.json(), { hello: 'world', remaining: 99 })
  assert.equal(r.headers.get('ratelimit-policy'), '"default";q=100;w=60')
  child.kill('SIGTERM')
  assert.equal(await child.exited, 0, child.err)
})

test('the TypeScript example type-checks', () => {
  const file = write('express-app.ts', all[2].code)
  const tsconfig = write(
    'tsconfig.json',
    JSON.stringify({
      compilerOptions: { strict: true, noEmit: true, target: 'es2022', module: 'nodenext', moduleResolution: 'nodenext', esModuleInterop: true, types: ['node'] },
      files: [path.basename(file)],
    }),
  )
  execFileSync(process.execPath, [path.join(PKG, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', tsconfig], { encoding: 'utf8' })
})

test('the TypeScript example type-checks as an ES module with the settings tsc --init writes', () => {
  // An .mts file is what a .ts file is in a "type": "module" project.
  const file = write('express-app-esm.mts', all[2].code)
  const tsconfig = write(
    'tsconfig.esm.json',
    JSON.stringify({
      compilerOptions: {
        module: 'nodenext',
        target: 'esnext',
        types: ['node'],
        noEmit: true,
        noUncheckedIndexedAccess: true,
        exactOptionalPropertyTypes: true,
        strict: true,
        verbatimModuleSyntax: true,
        isolatedModules: true,
        noUncheckedSideEffectImports: true,
        moduleDetection: 'force',
        skipLibCheck: false,
      },
      files: [path.basename(file)],
    }),
  )
  execFileSync(process.execPath, [path.join(PKG, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', tsconfig], { encoding: 'utf8' })
})

test('the Fastify example serves with RateLimit headers, per-route config, and exits on SIGTERM', async () => {
  const child = run(write('fastify-app.js', all[3].code), { PORT: '0' })
  let url
  const deadline = Date.now() + 30000
  while (!(url = (child.out.match(/listening on (\S+)/) || [])[1])) {
    assert.ok(Date.now() < deadline, `the example did not start: ${child.err}`)
    await new Promise((r) => setTimeout(r, 20))
  }
  const r = await fetch(url, { headers: { 'x-api-key': 'k1' } })
  assert.equal(r.status, 200)
  assert.deepEqual(await r.json(), { hello: 'world', remaining: 99 })
  assert.equal(r.headers.get('ratelimit-policy'), '"default";q=100;w=60')
  const search = await fetch(`${url}/search`, { headers: { 'x-api-key': 'k1' } })
  assert.equal(search.status, 200)
  assert.match(search.headers.get('ratelimit'), /^"default";r=94;/)
  const health = await fetch(`${url}/health`)
  assert.equal(health.status, 200)
  assert.equal(health.headers.get('ratelimit'), null)
  child.kill('SIGTERM')
  assert.equal(await child.exited, 0, child.err)
})

test('the OpenTelemetry example exports the limiter metrics', async () => {
  const child = run(write('otel.js', all[6].code))
  assert.equal(await child.exited, 0, child.err)
  assert.match(child.out, /name: 'quotalease_admitted'[\s\S]*?value: 3\b/)
  assert.match(child.out, /name: 'quotalease_overshoot_bound'/)
  assert.match(child.out, /limiter: 'api'/)
})

test('the tiers and policy store example prints what its comments say', async () => {
  const child = run(write('tiers.js', all[4].code))
  assert.equal(await child.exited, 0, child.err)
  const lines = child.out.trim().split('\n')
  assert.equal(lines[0], '5 "default";q=5;w=60')
  assert.equal(lines[1], '0 [ { limit: 10, windowMs: 1000 }, { limit: 1000, windowMs: 86400000 } ]')
  assert.equal(lines[2], '"1s";q=10;w=1, "1day";q=1000;w=86400')
  assert.equal(lines[3], '20')
  assert.equal(lines[4], 'tier pro (assigned by store, defined in store)')
  assert.equal(lines[5], '20/s, 5000/day')
  const listing = lines.slice(6).join('\n')
  assert.match(listing, /version: 2/)
  assert.match(listing, /tiers: \[ \{ name: 'pro', rules: '20\/s, 5000\/day' \} \]/)
  assert.match(listing, /keys: \[ \{ key: 'user:1', assignment: 'tier:pro' \} \]/)
})

test('the Express example with tiers gives a pro key both rules and others the free tier', async () => {
  const child = run(write('express-tiers.js', all[5].code), { PORT: '0' })
  let url
  const deadline = Date.now() + 30000
  while (!(url = (child.out.match(/listening on (\S+)/) || [])[1])) {
    assert.ok(Date.now() < deadline, `the example did not start: ${child.err}`)
    await new Promise((r) => setTimeout(r, 20))
  }
  const pro = await fetch(url, { headers: { 'x-api-key': 'key-of-a-pro' } })
  assert.equal(pro.status, 200)
  assert.equal(pro.headers.get('ratelimit-policy'), '"1s";q=20;w=1, "1day";q=100000;w=86400')
  assert.deepEqual(await pro.json(), { limit: 20, rules: 2 })
  const free = await fetch(url, { headers: { 'x-api-key': 'someone' } })
  assert.equal(free.headers.get('ratelimit-policy'), '"default";q=100;w=60')
  assert.deepEqual(await free.json(), { limit: 100, rules: 1 })
  child.kill('SIGTERM')
  assert.equal(await child.exited, 0, child.err)
})

test("the project README's Node example runs", async () => {
  const child = run(write('project-readme.js', projectReadmeBlock()))
  assert.equal(await child.exited, 0, child.err)
  assert.deepEqual(child.out.trim().split('\n'), ['0 true 4 lease', '1 true 3 lease', '2 true 2 lease', '3 true 1 lease', '4 true 0 lease', '5 false 0 exhausted'])
})

test("the project README's calendar-quota example prints what its comments say", async () => {
  const child = run(write('project-readme-calendar.js', projectReadmeBlock('Calendar quotas')))
  assert.equal(await child.exited, 0, child.err)
  assert.deepEqual(child.out.trim().split('\n'), ['false 3600000', '"1s";q=10;w=1, "1month";q=50000;w=2592000'])
})

test("the project README's concurrency-limit example prints what its comments say", async () => {
  const child = run(write('project-readme-concurrency.js', projectReadmeBlock('Concurrency limits')))
  assert.equal(await child.exited, 0, child.err)
  assert.deepEqual(child.out.trim().split('\n'), ['200 true true true true true false'])
})

test('the behind-a-proxy example keys each client behind the trusted proxy', async () => {
  const child = run(write('proxy-app.js', all[7].code), { PORT: '0' })
  let url
  const deadline = Date.now() + 30000
  while (!(url = (child.out.match(/listening on (\S+)/) || [])[1])) {
    assert.ok(Date.now() < deadline, `the example did not start: ${child.err}`)
    await new Promise((r) => setTimeout(r, 20))
  }
  const remaining = async (xff) => (await (await fetch(url, { headers: { 'x-forwarded-for': xff } })).json()).remaining
  assert.equal(await remaining('1.2.3.4'), 99)
  assert.equal(await remaining('6.6.6.6, 1.2.3.4'), 98) // the same client, a spoofed left part
  assert.equal(await remaining('5.6.7.8'), 99) // another client, its own bucket
  child.kill('SIGTERM')
  assert.equal(await child.exited, 0, child.err)
})

test('the reserve, then settle example prints what its comments say', async () => {
  const child = run(write('reserve.js', all[8].code))
  assert.equal(await child.exited, 0, child.err)
  const lines = child.out.trim().split('\n')
  // 1000 - 120 used - 1 (a token refills every 3.6 s)
  assert.match(lines[0], /^true (879|880)$/)
  assert.equal(lines[1], '150')
})

test('the concurrency-limit example prints what its comments say', async () => {
  const child = run(write('concurrency.js', all[9].code))
  assert.equal(await child.exited, 0, child.err)
  assert.deepEqual(child.out.trim().split('\n'), ['429, retry in 250 ms', 'exported false'])
})
