'use strict'
// Reserve, then settle, in Express: each API key may stream so many bytes
// an hour. A response's size is known only once it was sent, so the
// middleware reserves an estimate before the handler runs (a key that
// cannot afford the estimate gets a 429) and settles with the bytes the
// response really sent when it finishes, or when the client went away
// mid-stream: the key is charged what was streamed, not the estimate.
//
//   node examples/express-reserve.js        (PORT=3000, QUOTALEASE_URL=redis://... for a fleet)
//   curl -H 'x-api-key: alice' 'http://127.0.0.1:3000/stream?kb=20'

const express = require('express')
const { Limiter, codes } = require('quotalease')

/** Bytes a response is expected to send: reserved before it runs. */
const ESTIMATE = 16 * 1024

/**
 * Middleware charging each key the bytes of body its responses send:
 * `reserve` the estimate, count what `res.write` / `res.end` send, and
 * `settle` with that count on `finish` (all sent) or `close` (the client
 * went away first), whichever comes first.
 */
function chargeBytes(limiter, { key, estimate }) {
  return async (req, res, next) => {
    let reservation
    try {
      reservation = await limiter.reserve(key(req), estimate)
    } catch (err) {
      return next(err)
    }
    res.set(reservation.decision.headers())
    if (!reservation.allowed) {
      // Denied: nothing was reserved, nothing to settle.
      return res.status(429).json({ error: 'byte budget spent', retryAfterMs: reservation.decision.retryAfterMs })
    }
    let sent = 0
    const count = (chunk, encoding) => {
      if (chunk !== undefined && chunk !== null && typeof chunk !== 'function') {
        sent += Buffer.byteLength(chunk, typeof encoding === 'string' ? encoding : undefined)
      }
    }
    const { write, end } = res
    res.write = function (chunk, encoding, cb) {
      count(chunk, encoding)
      return write.call(this, chunk, encoding, cb)
    }
    res.end = function (chunk, encoding, cb) {
      count(chunk, encoding)
      return end.call(this, chunk, encoding, cb)
    }
    const settle = () => {
      if (reservation.settled) return // 'finish' and then 'close': settled once
      try {
        reservation.settle(sent) // below the estimate the rest goes back; above, the key owes it
      } catch (err) {
        // A limiter closed at shutdown keeps the estimate; anything else is a bug.
        if (err.code !== codes.CLOSED) throw err
      }
    }
    res.on('finish', settle)
    res.on('close', settle)
    next()
  }
}

/** The app: `GET /stream?kb=N` streams N KiB in 1 KiB chunks, a turn of the event loop apart. */
function createApp(limiter) {
  const app = express()
  app.use(chargeBytes(limiter, { key: (req) => req.get('x-api-key') || req.ip, estimate: ESTIMATE }))
  app.get('/stream', async (req, res) => {
    const kb = Math.min(Number.parseInt(req.query.kb, 10) || 1, 64)
    res.type('text/plain')
    const line = 'x'.repeat(1023) + '\n'
    for (let i = 0; i < kb && !res.destroyed; i++) {
      res.write(line)
      await new Promise(setImmediate) // as a generator producing the response would
    }
    res.end()
  })
  return app
}

module.exports = { chargeBytes, createApp, ESTIMATE }

if (require.main === module) {
  const limiter = new Limiter({ url: process.env.QUOTALEASE_URL, rate: '1000000/hour' }) // bytes per key
  const server = createApp(limiter).listen(Number(process.env.PORT || 3000), () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`)
  })
  process.on('SIGTERM', () => server.close(() => limiter.close()))
}
