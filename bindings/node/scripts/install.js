#!/usr/bin/env node
'use strict'
// npm `install` script: make sure a native addon that loads is in place.
//
// 1. In the quotalease repository (bindings/node inside the Cargo
//    workspace): always build from the working tree, so the addon never lags
//    the source (cargo makes an up-to-date build a no-op). With the dev
//    dependencies installed this uses `napi build`, which also regenerates
//    binding.js / binding.d.ts; otherwise plain cargo.
// 2. Elsewhere (installed from the registry or a packed tarball): use a
//    prebuilt binary when one loads (`quotalease.<platform>.node` beside this
//    package, or the optional package `quotalease-<platform>`); otherwise
//    build the Rust sources shipped in `rust/` with cargo.
//
// QUOTALEASE_NODE_BUILD=always forces a source build; =never skips it.

const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const pkgDir = path.resolve(__dirname, '..')
const log = (msg) => process.stderr.write(`quotalease: ${msg}\n`)

function platformArchAbi() {
  const { platform, arch } = process
  if (platform !== 'linux') return `${platform}-${arch}`
  let glibc = true
  try {
    const report = process.report && process.report.getReport()
    glibc = Boolean(report && report.header && report.header.glibcVersionRuntime)
  } catch {
    glibc = true
  }
  return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
}

/** Does the package's loader find an addon that loads? (in a child: a failed dlopen can't be undone) */
function addonLoads() {
  const r = spawnSync(
    process.execPath,
    ['-e', `const b = require(${JSON.stringify(path.join(pkgDir, 'binding.js'))}); if (typeof b.NativeLimiter !== 'function') process.exit(3)`],
    { stdio: 'ignore', env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: '' } },
  )
  return r.status === 0
}

/** The repository root when this package is bindings/node of a quotalease checkout. */
function inRepository() {
  const root = path.resolve(pkgDir, '..', '..')
  try {
    const manifest = fs.readFileSync(path.join(root, 'Cargo.toml'), 'utf8')
    const here = fs.realpathSync(pkgDir) === fs.realpathSync(path.join(root, 'bindings', 'node'))
    return here && /\[workspace\]/.test(manifest) && /"bindings\/node"/.test(manifest) ? root : null
  } catch {
    return null
  }
}

function run(cmd, args, opts = {}) {
  log(`$ ${cmd} ${args.join(' ')}`)
  const r = spawnSync(cmd, args, { stdio: ['ignore', 'inherit', 'inherit'], ...opts })
  if (r.error) throw r.error
  return r
}

function requireCargo() {
  const r = spawnSync('cargo', ['--version'], { encoding: 'utf8' })
  if (r.error || r.status !== 0) {
    log(
      `no prebuilt addon fits ${platformArchAbi()} and cargo (Rust) is not installed, so it cannot be built.\n` +
        '  Install Rust (https://rustup.rs), then run `npm rebuild quotalease`.',
    )
    process.exit(1)
  }
  log(`building the native addon from source with ${r.stdout.trim()} (a few minutes the first time)`)
}

/** cargo build; returns the path of the built cdylib. */
function cargoBuild(manifestPath, targetDir) {
  const extra = targetDir ? ['--target-dir', targetDir] : []
  const r = spawnSync(
    'cargo',
    ['build', '--release', '-p', 'quotalease-node', '--manifest-path', manifestPath, '--message-format=json-render-diagnostics', ...extra],
    { stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 },
  )
  if (r.error) throw r.error
  if (r.status !== 0) {
    log('cargo build failed (see the messages above)')
    process.exit(r.status || 1)
  }
  let lib = null
  for (const line of r.stdout.split('\n')) {
    if (!line.startsWith('{')) continue
    const msg = JSON.parse(line)
    if (msg.reason === 'compiler-artifact' && msg.target && msg.target.name === 'quotalease_node') {
      lib = msg.filenames.find((f) => /\.(so|dylib|dll)$/.test(f)) || lib
    }
  }
  if (!lib) {
    log('cargo did not report the built library')
    process.exit(1)
  }
  return lib
}

function install(lib) {
  const dest = path.join(pkgDir, `quotalease.${platformArchAbi()}.node`)
  // Copy to a temporary name, then rename: a running process may have the old file mapped.
  const tmp = `${dest}.${process.pid}.tmp`
  fs.copyFileSync(lib, tmp)
  fs.renameSync(tmp, dest)
  log(`installed ${path.relative(process.cwd(), dest) || dest}`)
}

function main() {
  const mode = process.env.QUOTALEASE_NODE_BUILD || 'auto'
  if (mode === 'never') {
    log('QUOTALEASE_NODE_BUILD=never: not building the native addon')
    return
  }
  const repo = inRepository()
  if (repo) {
    const cli = path.join(pkgDir, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js')
    requireCargo()
    if (fs.existsSync(cli)) {
      const r = run(process.execPath, [cli, 'build', '--platform', '--release', '--js', 'binding.js', '--dts', 'binding.d.ts'], {
        cwd: pkgDir,
      })
      if (r.status !== 0) process.exit(r.status || 1)
    } else {
      install(cargoBuild(path.join(repo, 'Cargo.toml')))
    }
  } else {
    if (mode !== 'always' && addonLoads()) {
      log(`using the prebuilt addon for ${platformArchAbi()}`)
      return
    }
    const manifest = path.join(pkgDir, 'rust', 'Cargo.toml')
    if (!fs.existsSync(manifest)) {
      log(`no prebuilt addon fits ${platformArchAbi()} and this package ships no Rust sources (${manifest}).`)
      process.exit(1)
    }
    requireCargo()
    // Build in a scratch target dir (unless CARGO_TARGET_DIR says where) and
    // drop it afterwards: only the addon is needed, not ~300 MB of objects.
    const scratch = process.env.CARGO_TARGET_DIR ? null : path.join(pkgDir, 'rust', 'target')
    install(cargoBuild(manifest, scratch))
    if (scratch) fs.rmSync(scratch, { recursive: true, force: true })
  }
  if (!addonLoads()) {
    log('the addon was built but does not load; please report this with the output above')
    process.exit(1)
  }
}

main()
