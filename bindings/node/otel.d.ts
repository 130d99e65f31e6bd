// Types of `quotalease/otel` (otel.js). Needs @opentelemetry/api.

import type { Attributes, Meter, MeterProvider } from '@opentelemetry/api'
import type { Limiter } from './index'

export interface InstrumentOptions {
  /** The meter to create the instruments on. Default: meter `quotalease` of `meterProvider`. */
  meter?: Meter
  /** Default: the global meter provider (`metrics.getMeterProvider()`). */
  meterProvider?: MeterProvider
  /** Attributes of every observation, e.g. `{ limiter: 'api' }`. */
  attributes?: Attributes
}

export interface Instrumentation {
  /** Stops observing the limiter (idempotent). */
  shutdown(): void
}

/** One engine metric, as read from its Prometheus exposition. */
export interface MetricSpec {
  /** The OTel instrument name: the exposition's name without a counter's `_total` (`quotalease_admitted`). */
  name: string
  /** The key in `limiter.metrics()`. */
  field: string
  description: string
  counter: boolean
}

/**
 * Observable OTel instruments for every metric of `limiter` (counters
 * `quotalease_admitted`, ..., gauges `quotalease_keys_tracked`, ...), read from
 * `limiter.metrics()` once per collection.
 */
export declare function instrument(limiter: Limiter, options?: InstrumentOptions): Instrumentation

export declare function metricSpecs(exposition: string): MetricSpec[]
