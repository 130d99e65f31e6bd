// Type-checked with `tsc -p test/tsconfig.json` (no emit): the types of
// quotalease/fastify and quotalease/otel as an application uses them. Lines
// marked @ts-expect-error must fail to compile.
import Fastify from 'fastify'
import { metrics } from '@opentelemetry/api'
import { MeterProvider } from '@opentelemetry/sdk-metrics'
import { Limiter, type Decision } from 'quotalease'
import rateLimit from 'quotalease/fastify'
import { rateLimit as named, type RateLimitPluginOptions } from 'quotalease/fastify'
import { instrument, metricSpecs, type Instrumentation } from 'quotalease/otel'

const limiter = new Limiter({ rate: '100/min' })
const strict = new Limiter({ rate: '5/min' })
const app = Fastify()

const options: RateLimitPluginOptions = {
  limiter,
  key: (request) => (request.headers['x-api-key'] as string | undefined) ?? request.ip,
  cost: (request) => (request.method === 'POST' ? 5 : 1),
  skip: (request) => request.url === '/health',
  onDenied: (request, reply, decision: Decision) => reply.code(429).send({ retryAfterMs: decision.retryAfterMs }),
  global: true,
}
void app.register(rateLimit, options)
void app.register(named, { limiter, key: async () => 'k' })
void app.register(rateLimit, { limiter, trustedProxies: ['10.0.0.0/8'] })
app.get('/hops', { config: { rateLimit: { trustedProxies: 2 } } }, async () => 'ok')
// @ts-expect-error trustedProxies is a hop count or CIDRs
void app.register(rateLimit, { limiter, trustedProxies: [10] })
// @ts-expect-error the limiter is required
void app.register(rateLimit, { key: () => 'k' })
// @ts-expect-error a key is a function
void app.register(rateLimit, { limiter, key: 'ip' })

app.get('/', async (request) => {
  const d: Decision | null = request.rateLimit
  return { remaining: d?.remaining }
})
app.get('/strict', { config: { rateLimit: { limiter: strict, cost: 2 } } }, async () => 'ok')
app.get('/free', { config: { rateLimit: false } }, async () => 'ok')
app.get('/pro', { config: { rateLimit: { tier: 'pro' } } }, async () => 'ok')
app.get('/plan', { config: { rateLimit: { tier: (request) => (request.headers['x-plan'] === 'pro' ? 'pro' : undefined) } } }, async () => 'ok')
// @ts-expect-error: tier is a string or a function
app.get('/badtier', { config: { rateLimit: { tier: 1 } } }, async () => 'ok')
// @ts-expect-error route options are checked too
app.get('/bad', { config: { rateLimit: { cost: 'one' } } }, async () => 'ok')

const provider = new MeterProvider()
const handle: Instrumentation = instrument(limiter, { meterProvider: provider, attributes: { limiter: 'api' } })
instrument(strict, { meter: metrics.getMeter('my-service') })
handle.shutdown()
const names: string[] = metricSpecs(limiter.metricsPrometheus()).map((s) => s.name)
void names
// @ts-expect-error attributes are OTel attribute values
instrument(limiter, { attributes: { x: { nested: true } } })
