"""Reserve, then settle, with FastAPI: a streamed response whose cost (the
tokens a model generates) is known only when the stream ends.

Each API key has a budget of 1000 tokens an hour. A request reserves
ESTIMATE tokens before it starts streaming (429 when the key cannot afford
them) and, when the stream ends, settles with the tokens it really sent:
below the estimate the rest goes back to the key, above it the key pays the
difference (into debt if need be: its next requests wait until the refill
has paid it).

    pip install "quotalease[fastapi]" uvicorn
    uvicorn fastapi_stream_settle:app          # from this directory
    curl -N -H 'x-api-key: ann' 'http://127.0.0.1:8000/generate?words=12'
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from quotalease import Limiter, Reservation

#: Tokens reserved before a response starts: what one usually costs.
ESTIMATE = 50


async def model(prompt: str, words: int) -> AsyncIterator[str]:
    """A stand-in for an LLM: streams `words` tokens."""
    for i in range(words):
        await asyncio.sleep(0)  # a real model awaits its next token here
        yield f"{prompt}{i} "


async def settled_stream(reservation: Reservation, tokens: AsyncIterator[str]) -> AsyncIterator[str]:
    """Yield the tokens and settle the reservation with how many were sent,
    also when the client goes away mid-stream (the generator is closed)."""
    sent = 0
    try:
        async for token in tokens:
            sent += 1
            yield token
    finally:
        reservation.settle(sent)


def create_app(limiter: Limiter) -> FastAPI:
    app = FastAPI()

    @app.get("/generate")
    async def generate(request: Request, prompt: str = "word", words: int = 10) -> Response:
        key = request.headers.get("x-api-key", "anonymous")
        reservation = await limiter.reserve_async(key, ESTIMATE)
        decision = reservation.decision
        if not reservation.allowed:
            return JSONResponse(
                {"detail": "rate limit exceeded", "retry_after_ms": decision.retry_after_ms},
                status_code=429,
                headers=decision.headers(),
            )
        return StreamingResponse(
            settled_stream(reservation, model(prompt, words)),
            media_type="text/plain",
            headers=decision.headers(),
        )

    return app


# "redis://127.0.0.1:6379" for a fleet: every instance then shares each key's budget.
app = create_app(Limiter("memory://", rate="1000/hour"))
