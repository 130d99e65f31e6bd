#!/usr/bin/env node
'use strict'
// The `quotalease` command (crate cli/: policy, inspect, top, bench, simulate)
// for node_modules/.bin and `npx quotalease`. The executable is prebuilt in the
// platform package that npm picked for this machine (quotalease-linux-x64-gnu
// ships `quotalease` beside the addon); this runs it with the same arguments,
// standard streams and exit status.
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

function findExecutable() {
  const base = `quotalease-${process.platform}-${process.arch}`
  for (const name of [`${base}-gnu`, `${base}-musl`, base]) {
    let dir
    try {
      dir = path.dirname(require.resolve(`${name}/package.json`))
    } catch {
      continue
    }
    const file = path.join(dir, 'quotalease')
    if (fs.existsSync(file)) return file
  }
  return null
}

const exe = findExecutable()
if (exe === null) {
  process.stderr.write(
    `quotalease: no prebuilt quotalease command for ${process.platform}-${process.arch} ` +
      '(only the linux-x64-gnu platform package ships one).\n' +
      'Build it from the quotalease repository with Rust: cargo build --release -p quotalease-cli\n',
  )
  process.exit(1)
}
const run = spawnSync(exe, process.argv.slice(2), { stdio: 'inherit' })
if (run.error) {
  process.stderr.write(`quotalease: cannot run ${exe}: ${run.error.message}\n`)
  process.exit(1)
}
if (run.signal) process.kill(process.pid, run.signal)
process.exit(run.status ?? 1)
