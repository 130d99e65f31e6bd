// Type-checked with `tsc -p test/tsconfig.json` (no emit): the package as an
// ES module application imports it (an .mts file is ESM under nodenext, as
// every .ts file is in a package with "type": "module", the setup `tsc --init`
// leads to). Each `quotalease/*` module is CommonJS; its default and named
// imports must have the plugin's and the functions' types.
import Fastify from 'fastify'
import { Limiter, codes, type Decision } from 'quotalease'
import rateLimit from 'quotalease/fastify'
import { rateLimit as named, type RateLimitPluginOptions, type RouteRateLimitOptions } from 'quotalease/fastify'
import { rateLimit as expressRateLimit } from 'quotalease/express'
import { instrument } from 'quotalease/otel'

const limiter = new Limiter({ rate: '100/min' })
const app = Fastify()
const options: RateLimitPluginOptions = { limiter, key: (request) => request.ip }
await app.register(rateLimit, options)
await app.register(named, { limiter, skip: (request) => request.url === '/health' })
// @ts-expect-error the limiter is required
await app.register(rateLimit, { key: () => 'k' })
const route: RouteRateLimitOptions = { cost: 5, tier: 'pro' }
app.get('/search', { config: { rateLimit: route } }, async (request) => {
  const d: Decision | null = request.rateLimit
  return { remaining: d?.remaining }
})
app.get('/health', { config: { rateLimit: false } }, async () => 'ok')
// @ts-expect-error route options are checked too
app.get('/bad', { config: { rateLimit: { cost: 'one' } } }, async () => 'ok')
const middleware = expressRateLimit({ limiter })
void middleware
instrument(limiter).shutdown()
const code: string = codes.CONFIG
void code
