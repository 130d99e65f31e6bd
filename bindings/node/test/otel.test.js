'use strict'
// quotalease/otel with the OpenTelemetry SDK: a MeterProvider with a
// pull reader (a MetricReader collected on demand), compared with the
// engine's own Prometheus exposition.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const { MeterProvider, MetricReader, DataPointType, AggregationTemporality } = require('@opentelemetry/sdk-metrics')
const { PrometheusExporter } = require('@opentelemetry/exporter-prometheus')

/** A reader that collects only when asked (the SDK's pull-reader base class). */
class ManualReader extends MetricReader {
  async onForceFlush() {}
  async onShutdown() {}
}

const { Limiter, codes } = require('..')
const { instrument, metricSpecs } = require('../otel')

function setup() {
  const reader = new ManualReader()
  const meterProvider = new MeterProvider({ readers: [reader] })
  return { reader, meterProvider }
}

/** Every metric collected: name -> { type, monotonic, description, points: [{ value, attributes }] }. */
async function collect(reader) {
  const { resourceMetrics, errors } = await reader.collect()
  assert.deepEqual(errors, [])
  const out = new Map()
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const m of scope.metrics) {
      out.set(m.descriptor.name, {
        scope: scope.scope.name,
        type: m.dataPointType,
        monotonic: m.isMonotonic,
        temporality: m.aggregationTemporality,
        description: m.descriptor.description,
        points: m.dataPoints.map((p) => ({ value: p.value, attributes: p.attributes })),
      })
    }
  }
  return out
}

/** The exposition as name -> { type, help, value }. */
function prometheus(text) {
  const out = new Map()
  for (const line of text.split('\n')) {
    let m = /^# HELP (\S+) (.*)$/.exec(line)
    if (m) out.set(m[1], { ...out.get(m[1]), help: m[2] })
    m = /^# TYPE (\S+) (\S+)$/.exec(line)
    if (m) out.set(m[1], { ...out.get(m[1]), type: m[2] })
    m = /^(quotalease_\w+) (\d+)$/.exec(line)
    if (m) out.set(m[1], { ...out.get(m[1]), value: Number(m[2]) })
  }
  return out
}

test('otel: every Prometheus metric, same name, kind, help and value', async (t) => {
  const { reader, meterProvider } = setup()
  const limiter = new Limiter({ limit: 3, windowMs: 60000, leaseSize: 1 })
  t.after(() => Promise.all([limiter.close(), meterProvider.shutdown()]))
  const handle = instrument(limiter, { meterProvider, attributes: { limiter: 'api' } })

  for (let i = 0; i < 5; i++) await limiter.acquire('user:1')
  await limiter.acquire('user:2')
  const otel = await collect(reader)
  const prom = prometheus(limiter.metricsPrometheus())
  assert.equal(prom.size, 13)
  assert.equal(otel.size, prom.size)
  for (const [promName, p] of prom) {
    const counter = p.type === 'counter'
    // OTel's Prometheus translation adds `_total` to a counter's name.
    const name = counter ? promName.replace(/_total$/, '') : promName
    const o = otel.get(name)
    assert.ok(o, `no OTel metric ${name} for ${promName}`)
    assert.equal(o.scope, 'quotalease')
    assert.equal(o.type, counter ? DataPointType.SUM : DataPointType.GAUGE, name)
    if (counter) {
      assert.equal(o.monotonic, true, name)
      assert.equal(o.temporality, AggregationTemporality.CUMULATIVE, name)
    }
    assert.equal(o.description, p.help, name)
    assert.deepEqual(o.points, [{ value: p.value, attributes: { limiter: 'api' } }], name)
  }
  // The values are the limiter's, not zeros: 4 admitted (3 + 1), 2 denied.
  assert.equal(otel.get('quotalease_admitted').points[0].value, 4)
  assert.equal(otel.get('quotalease_denied').points[0].value, 2)
  assert.equal(otel.get('quotalease_keys_tracked').points[0].value, 2)

  // Later collections see later values; after shutdown() nothing is observed.
  await limiter.acquire('user:3')
  const before = await collect(reader)
  assert.equal(before.get('quotalease_admitted').points[0].value, 5)
  handle.shutdown()
  handle.shutdown()
  await limiter.acquire('user:4')
  assert.equal(limiter.metrics().admitted, 6)
  // The SDK may keep reporting a cumulative stream's last value; it must not
  // see the 6th admission.
  const after = await collect(reader)
  for (const [name, m] of after) {
    assert.ok(m.points.length === 0 || JSON.stringify(m.points) === JSON.stringify(before.get(name).points), `${name} still observed after shutdown()`)
  }
  assert.notEqual(JSON.stringify(after.get('quotalease_admitted').points), JSON.stringify([{ value: 6, attributes: { limiter: 'api' } }]))
})

test('otel: two limiters on one meter, told apart by attributes', async (t) => {
  const { reader, meterProvider } = setup()
  const meter = meterProvider.getMeter('my-service')
  const a = new Limiter({ limit: 5, leaseSize: 1 })
  const b = new Limiter({ limit: 5, leaseSize: 1 })
  t.after(() => Promise.all([a.close(), b.close(), meterProvider.shutdown()]))
  instrument(a, { meter, attributes: { limiter: 'a' } })
  instrument(b, { meter, attributes: { limiter: 'b' } })
  await a.acquire('k')
  await b.acquire('k')
  await b.acquire('k')
  const admitted = (await collect(reader)).get('quotalease_admitted')
  assert.equal(admitted.scope, 'my-service')
  const byLimiter = Object.fromEntries(admitted.points.map((p) => [p.attributes.limiter, p.value]))
  assert.deepEqual(byLimiter, { a: 1, b: 2 })
})

test('otel: metricSpecs reads names and kinds from the exposition; bad input is a typed error', () => {
  const specs = metricSpecs(new Limiter({ limit: 1 }).metricsPrometheus())
  assert.deepEqual(
    specs.map((s) => `${s.name}:${s.counter ? 'counter' : 'gauge'}`),
    [
      'quotalease_admitted:counter',
      'quotalease_denied:counter',
      'quotalease_backend_calls:counter',
      'quotalease_backend_errors:counter',
      'quotalease_tokens_leased:counter',
      'quotalease_tokens_returned:counter',
      'quotalease_tokens_expired:counter',
      'quotalease_fallback_active:gauge',
      'quotalease_fallback_transitions:counter',
      'quotalease_keys_tracked:gauge',
      'quotalease_overshoot_bound:gauge',
      'quotalease_shadow_denied:counter',
      'quotalease_tokens_debited:counter',
    ],
  )
  assert.throws(() => instrument({}), { name: 'TypeError', code: codes.CONFIG })
  const l = new Limiter({ limit: 1 })
  assert.throws(() => instrument(l, { metre: 1 }), { code: codes.CONFIG, message: /unknown option `metre`/ })
  assert.throws(() => instrument(l, { attributes: 'x' }), { name: 'TypeError', code: codes.CONFIG })
})

test("otel: scraped through OTel's Prometheus exporter, exactly the exposition's samples", async (t) => {
  const exporter = new PrometheusExporter({ preventServerStart: true })
  const meterProvider = new MeterProvider({ readers: [exporter] })
  const limiter = new Limiter({ limit: 3, windowMs: 60000, leaseSize: 1 })
  // The exporter's handler behind a real HTTP server on a loopback port.
  const server = http.createServer((req, res) => exporter.getMetricsRequestHandler(req, res))
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  t.after(() => Promise.all([limiter.close(), meterProvider.shutdown(), new Promise((r) => server.close(r))]))
  instrument(limiter, { meterProvider, attributes: { limiter: 'api' } })
  for (let i = 0; i < 5; i++) await limiter.acquire('user:1')

  const text = await (await fetch(`http://127.0.0.1:${server.address().port}/metrics`)).text()
  const scraped = new Map()
  for (const line of text.split('\n')) {
    const m = /^(quotalease_\w+)\{([^}]*)\} (\d+)/.exec(line)
    if (m) {
      assert.match(m[2], /limiter="api"/, line)
      scraped.set(m[1], Number(m[3]))
    }
  }
  const prom = prometheus(limiter.metricsPrometheus())
  assert.deepEqual(
    [...scraped.entries()].sort(),
    [...prom.entries()].map(([name, p]) => [name, p.value]).sort(),
    text,
  )
  assert.equal(scraped.get('quotalease_admitted_total'), 3)
  assert.equal(scraped.get('quotalease_denied_total'), 2)
})
