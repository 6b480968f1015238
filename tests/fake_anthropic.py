"""A scripted Messages-API server on 127.0.0.1 that makes the real Claude Code client run the
tool calls a test chooses, so the real hooks fire without a model.

Each request of the agent loop (one that offers tools) gets the next scripted tool call; once
the script is spent, ``agent(body)`` (when given) chooses the call from the conversation so far,
or None; otherwise, and for side requests without tools, it answers a short text."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeAnthropic:
    def __init__(self, calls, agent=None):
        self.calls = list(calls)      # [(tool_name, input_dict)]
        self.agent = agent            # body -> (tool_name, input_dict) | None, after the calls
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def tool_results(self) -> list:
        """Every tool_result block the client sent back, in order (deduplicated by id)."""
        seen, out = set(), []
        for body in self.requests:
            for m in body.get("messages", []):
                if isinstance(m.get("content"), list):
                    for block in m["content"]:
                        if block.get("type") == "tool_result" and block["tool_use_id"] not in seen:
                            seen.add(block["tool_use_id"])
                            out.append(block)
        return out

    def _next(self, body):
        with self.lock:
            self.requests.append(body)
            call = None
            if body.get("tools") and self.calls:
                call = self.calls.pop(0)
            elif body.get("tools") and self.agent is not None:
                call = self.agent(body)
            if call is not None:
                name, args = call
                return {"type": "tool_use", "id": f"toolu_{len(self.requests):04d}", "name": name, "input": args}
            return {"type": "text", "text": "done"}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if self.path.startswith("/v1/messages/count_tokens"):
                    return self._json({"input_tokens": 100})
                if not self.path.startswith("/v1/messages"):
                    return self._json({"type": "error", "error": {"type": "not_found_error", "message": "no"}}, 404)
                block = fake._next(body)
                stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
                msg = {"id": f"msg_{len(fake.requests)}", "type": "message", "role": "assistant",
                       "model": body.get("model", "claude"), "content": [], "stop_reason": None,
                       "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 10}}
                if not body.get("stream"):
                    return self._json({**msg, "content": [block], "stop_reason": stop})
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                start = dict(block, input={}) if block["type"] == "tool_use" else {"type": "text", "text": ""}
                delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                         if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
                for event, data in [
                    ("message_start", {"type": "message_start", "message": msg}),
                    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
                    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                       "usage": {"output_tokens": 10}}),
                    ("message_stop", {"type": "message_stop"})]:
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def do_GET(self):
                self._json({})

            def do_HEAD(self):
                self.send_response(200)
                self.end_headers()

            def _json(self, obj, code=200):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def text_of(content) -> str:
    """The text of a message's or a tool result's content (a string, or a list of blocks)."""
    if isinstance(content, str):
        return content
    return "\n".join(text_of(b.get("content", "")) if b.get("type") == "tool_result" else b.get("text", "")
                     for b in content or [] if isinstance(b, dict))
