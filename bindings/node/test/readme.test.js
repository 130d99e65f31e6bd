'use strict'
// The package README's examples (bindings/node/README.md) work when copied:
// the JavaScript ones run, the TypeScript one type-checks.

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

test('the README has the quick start and the Express examples in JS and TS', () => {
  assert.deepEqual(all.map((b) => b.lang), ['js', 'js', 'ts'])
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
