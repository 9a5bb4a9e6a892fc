"""Zero-compute stub engine for bench/peers.py (a stand-in for SGLang/vLLM whose own time is ~nothing,
so what a proxy in front of it costs is what gets measured). Listens on 127.0.0.1 only.

Answers at once, with a fixed reply (`--reply-ids`, `--reply-text`):
  POST /generate              SGLang's token API; streamed: one SSE event per token, cumulative output_ids
  POST /v1/chat/completions   OpenAI chat; streamed: one delta per token
  GET  anything else          200 {} (health probes, /v1/models)
Streamed replies wait `--token-delay-ms` before each token; whole replies come at once.

    python bench/stub_engine.py --port P --reply-ids 429,18,2 --reply-text "ok, next step"
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request"}


class Stub:
    def __init__(self, ids: list[int], text: str, delay_s: float) -> None:
        self.ids, self.text, self.delay_s = ids, text, delay_s
        self.pieces = _split(text, len(ids))  # one text piece per token for streamed chat

    def generate(self, body: dict) -> dict:
        n = len(self.ids)
        return {"text": self.text, "output_ids": self.ids,
                "meta_info": {"id": "stub", "finish_reason": {"type": "stop", "matched": self.ids[-1]},
                              "prompt_tokens": len(body.get("input_ids") or []), "completion_tokens": n,
                              "output_token_logprobs": [[-0.5, t, None] for t in self.ids]}}

    def chat(self, body: dict) -> dict:
        return {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "stub"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": len(self.ids), "total_tokens": 10 + len(self.ids)}}

    def generate_events(self, body: dict) -> list[dict]:
        out = []
        for k in range(1, len(self.ids) + 1):
            done = k == len(self.ids)
            out.append({"text": "".join(self.pieces[:k]), "output_ids": self.ids[:k],
                        "meta_info": {"id": "stub", "finish_reason": {"type": "stop"} if done else None,
                                      "prompt_tokens": len(body.get("input_ids") or []), "completion_tokens": k,
                                      "output_token_logprobs": [[-0.5, t, None] for t in self.ids[:k]]}})
        return out

    def chat_events(self, body: dict) -> list[dict]:
        base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model", "stub")}
        out = []
        for k, piece in enumerate(self.pieces):
            delta = {"role": "assistant", "content": piece} if k == 0 else {"content": piece}
            last = k == len(self.pieces) - 1
            out.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}]})
        return out


def _split(text: str, n: int) -> list[str]:
    step = max(1, -(-len(text) // n))
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    return (pieces + [""] * n)[:n]


async def handle(stub: Stub, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
            body_raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(body_raw) if body_raw else {}
            keep = headers.get("connection", "").lower() != "close"
            await answer(stub, method, path.split("?")[0], body, writer)
            if not keep:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def answer(stub: Stub, method: str, path: str, body: dict, writer: asyncio.StreamWriter) -> None:
    kind = {"/generate": "generate", "/v1/chat/completions": "chat"}.get(path) if method == "POST" else None
    if kind and body.get("stream"):
        events = stub.generate_events(body) if kind == "generate" else stub.chat_events(body)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            await asyncio.sleep(stub.delay_s)
            _chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
        _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
    else:
        data = stub.generate(body) if kind == "generate" else stub.chat(body) if kind == "chat" else {}
        raw = json.dumps(data).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw)
                     + raw)
    await writer.drain()


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def serve(port: int, stub: Stub) -> None:
    server = await asyncio.start_server(lambda r, w: handle(stub, r, w), "127.0.0.1", port, backlog=256)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--reply-ids", default="429,18,227,689,404,75,86,2", help="comma-separated token ids")
    ap.add_argument("--reply-text", default="ok, next step")
    ap.add_argument("--token-delay-ms", type=float, default=20.0, help="wait before each streamed token")
    args = ap.parse_args()
    stub = Stub([int(x) for x in args.reply_ids.split(",")], args.reply_text, args.token_delay_ms / 1000)
    asyncio.run(serve(args.port, stub))


if __name__ == "__main__":
    main()
