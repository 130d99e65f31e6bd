'use strict'
// OpenTelemetry metrics for a Limiter (opt-in; needs @opentelemetry/api, an
// optional peer dependency). Observable instruments read `limiter.metrics()`
// once per collection. Names, descriptions and kinds come from the engine's
// Prometheus exposition, so the two never drift: the exposition's counter
// `quotalease_admitted_total` is the OTel counter `quotalease_admitted`, which
// OTel's Prometheus translation exports as `quotalease_admitted_total` again;
// gauges keep their name. Python's quotalease.otel and Go's otelrl name them the
// same way. No units are set, because the translation would add them to the names.

const { Limiter, engineVersion } = require('./index.js')
const { fail } = require('./http-common.js')

function loadApi() {
  try {
    return require('@opentelemetry/api')
  } catch (cause) {
    const err = fail(Error, 'quotalease/otel needs @opentelemetry/api: npm install @opentelemetry/api')
    err.cause = cause
    throw err
  }
}

/**
 * The engine's metrics as `{ name, field, description, counter }`, read from
 * its Prometheus exposition (`# HELP` / `# TYPE` lines).
 */
function metricSpecs(exposition) {
  const help = new Map()
  const specs = []
  for (const line of exposition.split('\n')) {
    let m = /^# HELP (\S+) (.*)$/.exec(line)
    if (m) {
      help.set(m[1], m[2])
      continue
    }
    m = /^# TYPE (\S+) (counter|gauge)$/.exec(line)
    if (m) {
      const counter = m[2] === 'counter'
      const short = m[1].replace(/^quotalease_/, '')
      const field = counter ? short.replace(/_total$/, '') : short
      specs.push({ name: `quotalease_${field}`, field, description: help.get(m[1]) || '', counter })
    }
  }
  return specs
}

/**
 * `instrument(limiter, { meter?, meterProvider?, attributes? })`: observable
 * instruments for every metric of `limiter` on `meter` (default: the
 * meter `quotalease` of `meterProvider`, or of the global provider). Each
 * observation carries `attributes` (e.g. `{ limiter: 'api' }` to tell
 * several limiters apart). Returns `{ shutdown() }`, which stops observing.
 */
function instrument(limiter, options = {}) {
  if (!(limiter instanceof Limiter)) {
    throw fail(TypeError, 'instrument(limiter): `limiter` must be a quotalease Limiter')
  }
  if (options === null || typeof options !== 'object') {
    throw fail(TypeError, 'instrument(limiter, options): options must be an object')
  }
  for (const name of Object.keys(options)) {
    if (!['meter', 'meterProvider', 'attributes'].includes(name)) {
      throw fail(Error, `instrument: unknown option \`${name}\` (known: meter, meterProvider, attributes)`)
    }
  }
  const { attributes = {} } = options
  if (attributes === null || typeof attributes !== 'object') {
    throw fail(TypeError, 'instrument: `attributes` must be an object of attribute values')
  }
  let { meter } = options
  if (!meter) {
    const provider = options.meterProvider || loadApi().metrics.getMeterProvider()
    meter = provider.getMeter('quotalease', engineVersion)
  }
  const specs = metricSpecs(limiter.metricsPrometheus())
  const instruments = specs.map((s) =>
    s.counter
      ? meter.createObservableCounter(s.name, { description: s.description })
      : meter.createObservableGauge(s.name, { description: s.description }),
  )
  const observe = (result) => {
    const m = limiter.metrics()
    for (let i = 0; i < specs.length; i++) result.observe(instruments[i], m[specs[i].field], attributes)
  }
  meter.addBatchObservableCallback(observe, instruments)
  let stopped = false
  return {
    shutdown() {
      if (stopped) return
      stopped = true
      meter.removeBatchObservableCallback(observe, instruments)
    },
  }
}

module.exports = { instrument, metricSpecs }
