// Type-checked with `tsc -p test/tsconfig.json` (no emit): the bundled types
// cover the API as an application uses it. Lines marked @ts-expect-error
// must fail to compile.
import express, { type Request } from 'express'
import {
  Limiter,
  Decision,
  headers,
  parseRate,
  httpKey,
  codes,
  metricsPrometheus,
  type DecisionFields,
  type Inspection,
  type KeyPolicy,
  type LimiterEvent,
  type PolicyListing,
  type PolicyRule,
  type TierInfo,
  type LimiterOptions,
  type Metrics,
  type QuotaLeaseError,
  type RateLimitHeaders,
  type Reason,
  Reservation,
  Permit,
  type ReserveOptions,
} from 'quotalease'
import { rateLimit } from 'quotalease/express'
import Fastify from 'fastify'
import fastifyRateLimit, { type RateLimitPluginOptions, type RouteRateLimitOptions } from 'quotalease/fastify'

const options: LimiterOptions = {
  url: 'redis://127.0.0.1:6379',
  rate: '600/min',
  leaseSize: 10,
  onBackendFailure: 'static-share',
  mode: 'lease',
  clock: { manualStartMs: 0 },
  onEvent: (e: LimiterEvent) => console.log(e.kind, e.message),
}
const limiter = new Limiter(options)
const manual = new Limiter({ limit: 5, clock: 'manual', clockStartMs: 0 })
const key: string = httpKey('x'.repeat(600))
void [manual, key]
limiter.on('degraded', (e) => console.warn(e.message.toUpperCase()))

async function handle(key: string): Promise<number> {
  const d: Decision = await limiter.acquire(key)
  const s: Decision = limiter.acquireSync(key, 2)
  const t: Decision = limiter.tryAcquire(key)
  const reason: Reason = d.reason
  const h: RateLimitHeaders = d.headers()
  const policy: string = h['RateLimit-Policy']
  const retry: string | undefined = h['Retry-After']
  const plain: DecisionFields = JSON.parse(JSON.stringify(s))
  headers(plain)
  const m: Metrics = limiter.metrics()
  limiter.setLimit('vip', 1000, 60000)
  limiter.setLimit('vip', '1000/min')
  const { limit, windowMs }: { limit: number; windowMs: number } = parseRate('10/s')
  await limiter.check()
  limiter.checkSync()
  const one: string = limiter.metricsPrometheus({ labels: { limiter: 'api' } })
  const all: string = metricsPrometheus([{ limiter, labels: { limiter: 'api' } }, { limiter: manual }])
  const misconfigured: 'ERR_QUOTALEASE_MISCONFIGURED' = codes.MISCONFIGURED
  void [one, all, misconfigured]
  await limiter.flush()
  await limiter.close()
  void [reason, policy, retry, t, limit, windowMs]
  return m.admitted + m.overshoot_bound + limiter.leaseSize
}

try {
  new Limiter({ limit: 0 })
} catch (err) {
  if ((err as QuotaLeaseError).code === codes.CONFIG) console.error((err as Error).message)
}

const app = express()
app.use(rateLimit<Request>({ limiter, key: (req) => req.ip ?? 'unknown', cost: 1 }))
app.use(rateLimit({ limiter, onDenied: (req, res, next, d) => res.writeHead(429).end(String(d.retryAfterMs)) }))
app.use(rateLimit({ limiter, trustedProxies: 1 }))
app.use(rateLimit({ limiter, trustedProxies: ['10.0.0.0/8', '::1'] }))
app.use(rateLimit({ limiter, trustedProxies: '10.0.0.0/8' }))
// @ts-expect-error trustedProxies is a hop count or CIDRs
app.use(rateLimit({ limiter, trustedProxies: true }))
app.use(rateLimit({ limiter, key: () => 'k', concurrency: true }))
// @ts-expect-error concurrency is true or false
app.use(rateLimit({ limiter, concurrency: 2 }))

async function readonlyDecision(): Promise<void> {
  const d = await limiter.acquire('k')
  // @ts-expect-error: the decision is readonly
  d.allowed = true
}
// @ts-expect-error: unknown option
new Limiter({ limit: 5, windowMS: 1000 })
// @ts-expect-error: a number is not a mode
new Limiter({ limit: 5, mode: 1 })
// @ts-expect-error: the key is a string
limiter.acquireSync(42)
// @ts-expect-error: httpKey takes a string
httpKey(42)
// @ts-expect-error: not an event of Limiter
limiter.on('degraded', (e: number) => e)

async function tiers(): Promise<void> {
  const t = new Limiter({ rate: '100/min', tiers: 'free=5/min; pro=10/s, 1000/day', defaultTier: 'free', policyFile: 'p.toml', policyRefreshMs: 500 })
  const a: Decision = await t.acquire('k', { tier: 'pro' })
  const b: Decision = await t.acquire('k', 2, { tier: null })
  const c: Decision = t.acquireSync('k', { tier: 'pro' })
  const d: Decision = t.tryAcquire('k', 1, {})
  const rules: readonly PolicyRule[] = a.rules
  const binding: PolicyRule = a.rules[a.rule]
  const p: KeyPolicy = t.policy('k', 'pro')
  const origin: 'config' | 'file' | 'store' | 'set_limit' | 'caller' | 'default_tier' = p.definedBy
  const list: TierInfo[] = t.tiers()
  const version: number = await t.policySetTier('gold', '20/s')
  await t.policyDeleteTier('gold')
  await t.policyAssign('k', 'tier:pro')
  await t.policyUnassign('k')
  const entry: string | null = await t.policyGet('k')
  const all: PolicyListing = await t.policyList()
  await t.refreshPolicies()
  const i: Inspection = t.inspect('k')
  const text: string = i.rules
  const tier: string | null = i.tier
  const src: string = i.policySource
  // A decision of an older version (no rules) still has headers.
  headers({ allowed: true, limit: 1, remaining: 0, retryAfterMs: 0, resetAfterMs: 0, windowMs: 1000, reason: 'lease' })
  // @ts-expect-error: the tier is a string
  await t.acquire('k', { tier: 5 })
  // @ts-expect-error: unknown acquire option
  t.acquireSync('k', 1, { plan: 'pro' })
  // @ts-expect-error: rules are readonly
  a.rules[0] = { limit: 1, windowMs: 1 }
  app.use(rateLimit({ limiter: t, tier: 'pro' }))
  app.use(rateLimit<Request>({ limiter: t, tier: (req) => (req.get('x-plan') === 'pro' ? 'pro' : undefined) }))
  // @ts-expect-error: tier is a string or a function
  app.use(rateLimit({ limiter: t, tier: 5 }))
  void [b, c, d, rules, binding, origin, list, version, entry, all, text, tier, src]
}

async function reservations(): Promise<number> {
  const r: Reservation = await limiter.reserve('k', 40)
  const s: Reservation = limiter.reserveSync('k', 40, { tier: 'pro' })
  const options: ReserveOptions = { tier: null }
  const t: Reservation = await limiter.reserve('k', 1, options)
  const allowed: boolean = r.allowed
  const d: Decision = r.decision
  const estimate: number = r.estimate
  const key: string = r.key
  const settled: boolean = r.settled
  const nothing: void = r.settle(10)
  const code: 'ERR_QUOTALEASE_RESERVATION' = codes.RESERVATION
  const debited: number = limiter.metrics().tokens_debited
  // @ts-expect-error: the estimate is required
  await limiter.reserve('k')
  // @ts-expect-error: the estimate is a number
  limiter.reserveSync('k', '40')
  // @ts-expect-error: reserve takes a tier, no waitMs
  await limiter.reserve('k', 1, { waitMs: 5 })
  // @ts-expect-error: the actual cost is a number
  s.settle('3')
  // @ts-expect-error: settled is readonly
  r.settled = true
  // @ts-expect-error: made by reserve, not by new
  new Reservation()
  void [t, allowed, d, key, settled, nothing, code]
  return estimate + debited
}

async function permits(): Promise<number> {
  const l = new Limiter({ limit: 100, concurrency: 5 })
  const p: Permit = await l.acquireConcurrent('k')
  const q: Permit = l.acquireConcurrentSync('k')
  const t: Permit = await l.acquireConcurrent('k', { tier: 'pro' })
  const u: Permit = l.acquireConcurrentSync('k', { tier: null })
  // @ts-expect-error: the tier is a string
  l.acquireConcurrentSync('k', { tier: 5 })
  const allowed: boolean = p.allowed
  const d: Decision = p.decision
  const key: string = p.key
  const released: boolean = p.released
  const nothing: void = q.release()
  // @ts-expect-error: the key is a string
  await l.acquireConcurrent(5)
  // @ts-expect-error: concurrency is a number
  new Limiter({ limit: 100, concurrency: '5' })
  // @ts-expect-error: released is readonly
  p.released = true
  // @ts-expect-error: made by acquireConcurrent, not by new
  new Permit()
  void [allowed, key, released, nothing, t, u]
  return d.limit
}

// quotalease/fastify with `concurrency: true`, plugin-wide and per route.
function fastifyConcurrency(): void {
  const l = new Limiter({ limit: 1000, concurrency: 3, tiers: 'free=1000/min, 1 concurrent' })
  const app = Fastify()
  const options: RateLimitPluginOptions = {
    limiter: l,
    concurrency: true,
    tier: (request) => (request.headers['x-plan'] === 'free' ? 'free' : undefined),
    onDenied: (request, reply, decision: Decision) => reply.code(429).send({ retryAfterMs: decision.retryAfterMs }),
  }
  void app.register(fastifyRateLimit, options)
  const route: RouteRateLimitOptions = { concurrency: false, cost: 2 }
  app.get('/export', { config: { rateLimit: { concurrency: true, tier: 'free' } } }, async (request) => request.rateLimit?.remaining)
  app.get('/search', { config: { rateLimit: route } }, async () => 'ok')
  // @ts-expect-error: concurrency is a boolean
  void app.register(fastifyRateLimit, { limiter: l, concurrency: 1 })
  // @ts-expect-error: concurrency is a boolean, per route too
  app.get('/bad', { config: { rateLimit: { concurrency: 'yes' } } }, async () => 'ok')
}

export { handle, readonlyDecision, tiers, reservations, permits, fastifyConcurrency }
