"""A real OpenAI-compatible chat server for the judge-client tests: a tiny transformers causal LM behind HTTP.

Run as a process (the tests start it with subprocess, as a user starts `vllm serve`):

    python tests/_helpers/openai_server.py --model DIR [--port 0] [--served-model-name NAME]

It prints `PORT <n>` on stdout once listening and serves, on 127.0.0.1:

    POST /v1/chat/completions  OpenAI chat completions: messages (text and image_url parts), max_tokens,
                               temperature (0: greedy), seed, n, logprobs + top_logprobs, stop at EOS;
                               choices[].message.content, finish_reason ('stop' / 'length'),
                               choices[].logprobs.content[{token, logprob, top_logprobs}] as vLLM returns it
    GET  /v1/models            the served model name
    GET  /stats                what the tests check: requests seen, the most requests in flight at once,
                               scripted failures sent, and the prompt each request was rendered to
    POST /control              test knobs: {"fail_next": N, "fail_status": 503, "delay_s": 0.2, "reset": true}

A text-only model cannot see pixels, so each image part becomes a text tag computed from the decoded image
(`<image WxH mean=M>`, M the mean 8-bit level), so a prompt still depends on the image the client sent. One
model call runs at a time (as one engine step); requests wait for it while counted as in flight.

`build_tiny_causal_lm(out_dir)` writes the model folder: the project's tiny byte-level BPE Qwen tokenizer
(mmreward.backbones.tiny_qwen_vl) and a seeded one-layer Qwen2ForCausalLM whose lm_head rows of "Yes" and "No"
get a component along the answer position's common hidden direction, so that a random model still puts both
answers among its top-20 first tokens (what a yes/no probability judge reads) while their balance varies
with the prompt.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

YES_NO_MARGIN = (0.5, 0.3)  # where the Yes and No logits sit relative to the mean top logit (calibration)
_CALIBRATION_PROMPTS = ("a cat.", "two blue squares.", "a red circle above a green triangle.", "a dog.")


def _calibration_texts() -> list[str]:
    """PaCo-Reward's GRPO question over two image tags: the judge prompt the yes/no tests send."""
    from mmreward.prompt_templates.vlm import TEMPLATES

    return [f"<img1>: <image 8x8 mean={60 + 40 * i}><img2>: <image 8x8 mean={200 - 30 * i}>"
            + TEMPLATES["grpo"].replace("{prompt}", p) for i, p in enumerate(_CALIBRATION_PROMPTS)]


def build_tiny_causal_lm(out_dir: str | Path, seed: int = 0, hidden: int = 32):
    """Write a tokenizer and a seeded tiny Qwen2ForCausalLM to `out_dir` (save_pretrained); returns (model, tok)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmreward.backbones.tiny_qwen_vl import build_qwen_tokenizer

    out = Path(out_dir)
    tok = build_qwen_tokenizer(out)
    ids = tok.convert_tokens_to_ids
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=False, pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                         bos_token_id=ids("<|endoftext|>"), initializer_range=0.5)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    # The answer position always follows the same "<|im_start|>assistant\n" tokens, so its final hidden states
    # share a large common direction u; "Yes" and "No" get a component along u that puts their logits near the
    # top, while each keeps its random row, so P(Yes) still moves with the prompt.
    calibration = [render_prompt(tok, [{"role": "user", "content": text}]) for text in _calibration_texts()]
    with torch.no_grad():
        hidden, top = [], []
        for prompt in calibration:
            res = model(**tok(prompt, return_tensors="pt", add_special_tokens=False), output_hidden_states=True)
            hidden.append(res.hidden_states[-1][0, -1])
            top.append(res.logits[0, -1].max())
        h = torch.stack(hidden)
        u = torch.nn.functional.normalize(h.mean(0), dim=0)
        scale = (h @ u).mean()
        for word, margin in zip(("Yes", "No"), YES_NO_MARGIN):
            (token_id,) = tok(word, add_special_tokens=False).input_ids
            row = model.lm_head.weight[token_id]
            row -= (row @ u) * u  # its own random part stays: the Yes/No balance depends on the prompt
            row += (torch.stack(top).mean() + margin) / scale * u
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(str(out))
    return model, tok


def image_tag(url: str) -> str:
    """The text a data-URL image becomes for the text-only model: its size and mean 8-bit level."""
    import numpy as np
    from PIL import Image

    if not url.startswith("data:") or ";base64," not in url:
        raise ValueError("image_url: only base64 data URLs are served here")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as im:
        arr = np.asarray(im.convert("RGB"))
    return f"<image {arr.shape[1]}x{arr.shape[0]} mean={int(round(float(arr.mean())))}>"


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """OpenAI chat messages -> the model's prompt string (chat template, generation prompt appended)."""
    flat = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            parts = []
            for c in content:
                if c.get("type") == "text":
                    parts.append(c["text"])
                elif c.get("type") == "image_url":
                    parts.append(image_tag(c["image_url"]["url"]))
                else:
                    raise ValueError(f"unsupported content part type {c.get('type')!r}")
            content = "".join(parts)
        flat.append({"role": m["role"], "content": content})
    return tokenizer.apply_chat_template(flat, add_generation_prompt=True, tokenize=False)


class Engine:
    """The model, one call at a time."""

    def __init__(self, model_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.eos = self.model.generation_config.eos_token_id
        self.lock = threading.Lock()

    def complete(self, body: dict) -> tuple[str, list[dict]]:
        torch = self.torch
        prompt = render_prompt(self.tok, body["messages"])
        n, k = int(body.get("n", 1)), int(body.get("top_logprobs") or 0)
        temperature = float(body.get("temperature", 1.0))
        want_logprobs = bool(body.get("logprobs"))
        inputs = self.tok(prompt, return_tensors="pt", add_special_tokens=False)
        kwargs = {"max_new_tokens": int(body.get("max_tokens", 16)), "num_return_sequences": n,
                  "return_dict_in_generate": True, "output_logits": True, "eos_token_id": self.eos,
                  "pad_token_id": self.model.generation_config.pad_token_id}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False)
        with self.lock, torch.inference_mode():
            if temperature > 0:
                torch.manual_seed(int(body.get("seed", 0)))
            out = self.model.generate(**inputs, **kwargs)
        new = out.sequences[:, inputs["input_ids"].shape[1]:]
        logp = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # (n, steps, V)
        choices = []
        for i in range(n):
            row = new[i].tolist()
            stop = row.index(self.eos) if self.eos in row else None
            kept = row if stop is None else row[: stop + 1]
            choice = {"index": i, "message": {"role": "assistant", "content": self.tok.decode(
                kept, skip_special_tokens=True)}, "finish_reason": "length" if stop is None else "stop"}
            if want_logprobs:
                content = []
                for t, token_id in enumerate(kept):
                    entry = {"token": self.tok.decode([token_id]), "logprob": float(logp[i, t, token_id])}
                    if k:
                        values, top_ids = logp[i, t].topk(k)
                        entry["top_logprobs"] = [{"token": self.tok.decode([j]), "logprob": float(v)}
                                                 for j, v in zip(top_ids.tolist(), values.tolist())]
                    content.append(entry)
                choice["logprobs"] = {"content": content}
            choices.append(choice)
        return prompt, choices


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = self.in_flight = self.max_in_flight = self.failed = 0
        self.fail_next, self.fail_status, self.delay_s = 0, 503, 0.0
        self.prompts: list[str] = []
        self.bodies: list[dict] = []

    def stats(self) -> dict:
        return {"requests": self.requests, "max_in_flight": self.max_in_flight, "failed": self.failed,
                "prompts": self.prompts, "sampling": [{k: b.get(k) for k in ("temperature", "seed", "n", "max_tokens",
                                                                                "logprobs", "top_logprobs")}
                                                       for b in self.bodies]}


def make_server(engine: Engine, served_name: str, port: int = 0) -> ThreadingHTTPServer:
    state = State()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx pools connections

        def log_message(self, *args):
            pass

        def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/stats":
                with state.lock:
                    self._send(200, state.stats())
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": served_name, "object": "model"}]})
            else:
                self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/control":
                with state.lock:
                    if body.get("reset"):
                        state.reset()
                    state.fail_next = int(body.get("fail_next", state.fail_next))
                    state.fail_status = int(body.get("fail_status", state.fail_status))
                    state.delay_s = float(body.get("delay_s", state.delay_s))
                self._send(200, {"ok": True})
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": f"no route POST {self.path}"})
                return
            with state.lock:
                state.requests += 1
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                fail = state.fail_next > 0
                if fail:
                    state.fail_next -= 1
                    state.failed += 1
                delay, status = state.delay_s, state.fail_status
            try:
                if delay:
                    time.sleep(delay)
                if fail:
                    self._send(status, {"error": {"message": "scripted failure", "code": status}},
                               {"Retry-After": "0"} if status == 429 else None)
                    return
                if body.get("model") != served_name:
                    self._send(404, {"error": {"message": f"model {body.get('model')!r} not served; "
                                                          f"this server has {served_name!r}"}})
                    return
                try:
                    prompt, choices = engine.complete(body)
                except (KeyError, ValueError, TypeError) as exc:
                    self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                    return
                with state.lock:
                    state.prompts.append(prompt)
                    state.bodies.append(body)
                self._send(200, {"id": f"chatcmpl-{state.requests}", "object": "chat.completion",
                                 "model": served_name, "choices": choices})
            finally:
                with state.lock:
                    state.in_flight -= 1

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="folder written by build_tiny_causal_lm")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--served-model-name", default="tiny-judge")
    args = ap.parse_args(argv)
    server = make_server(Engine(args.model), args.served_model_name, args.port)
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # mmreward from this checkout
    main()
