#!/usr/bin/env python3
"""POST /v1/embeddings (issue 49) under the official `openai` client, against the independent
numpy reference (tests/reference/ref_forward.py, float64).

Random-weight GGUFs written by tests/reference/family_gguf.py: a Qwen3-Embedding-shaped qwen3
with last-token pooling and a llama with mean pooling. Each vector tandem returns (for token
arrays, strings, several inputs in one pass, and an input longer than the pass's token budget so
that it spans passes) equals the reference's pooled, L2-normalised final hidden state with
cosine > 0.9999; base64 decodes to the same floats; usage counts the tokens. A generation-only
model answers 400 saying why; bad fields are 400s naming their JSON path.
Exit code 77 (CTest: skipped) when numpy, gguf or openai is missing.

    python3 tests/server/test_embeddings.py --tandem build/tandem
"""
import argparse
import base64
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from test_openai_server import SKIP, check, failures, raw, start_server  # noqa: E402

LAST, MEAN = 3, 1  # llama.cpp's pooling_type values


def cosine(a, b, np):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def tokens_of(port, text):
    code, data = raw(port, "POST", "/tokenize", json.dumps({"content": text, "add_special": True}).encode())
    return json.loads(data)["tokens"]


def check_model(a, path, pooling, label, openai, np, ref):
    model = ref.RefModel(path)
    # A pass of at most 16 tokens: the 40-token input spans three, the short ones share one.
    proc, port = start_server(a.tandem, path, ["--activations", "f32", "--batch-tokens", "16"])
    try:
        oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        inputs = [[5, 17, 42, 99, 7], [200, 3], [(i * 37) % 290 + 5 for i in range(40)], [11]]
        r = oc.embeddings.create(model="m", input=inputs)
        for i, toks in enumerate(inputs):
            want = ref.embedding(model, toks, pooling)
            got = r.data[i].embedding
            c = cosine(got, want, np)
            check(c > 0.9999 and abs(np.linalg.norm(got) - 1) < 1e-4 and len(got) == model.n_embd,
                  f"{label}: input {i} ({len(toks)} tokens): cosine {c:.6f} to the reference, norm {np.linalg.norm(got):.5f}")
        check(r.usage.prompt_tokens == sum(len(t) for t in inputs), f"{label}: usage counts {r.usage.prompt_tokens} tokens")
        one = oc.embeddings.create(model="m", input=inputs[0]).data[0].embedding
        check(cosine(one, r.data[0].embedding, np) > 0.99999, f"{label}: one token array alone gives the same vector")
        text = "hello world"
        s = oc.embeddings.create(model="m", input=text).data[0].embedding
        check(cosine(s, ref.embedding(model, tokens_of(port, text), pooling), np) > 0.9999,
              f"{label}: a string, as its tokens (special tokens added, as a completions prompt's)")
        code, data = raw(port, "POST", "/v1/embeddings", json.dumps({"input": [inputs[1]], "encoding_format": "base64"}).encode())
        b64 = np.frombuffer(base64.b64decode(json.loads(data)["data"][0]["embedding"]), dtype="<f4")
        check(code == 200 and np.allclose(b64, r.data[1].embedding, atol=1e-6), f"{label}: base64 is the same floats")
        for body, param in [({"input": [[1, 2, 999999]]}, "input[0][2]"), ({"input": "x", "dimensions": 7}, "dimensions"),
                            ({"input": "x", "foo": 1}, "foo"), ({"input": []}, "input"), ({"input": [""]}, "input[0]")]:
            code, data = raw(port, "POST", "/v1/embeddings", json.dumps(body).encode())
            err = json.loads(data).get("error", {})
            check(code == 400 and err.get("param") == param, f"{label}: {json.dumps(body)} -> 400 naming {param} ({err.get('param')})")
    finally:
        proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    a = ap.parse_args()
    try:
        import numpy as np
        import openai
        import family_gguf
        import ref_forward as ref
    except ImportError as e:
        print(f"skip: {e.name} is not installed (scripts/setup.sh installs it)")
        return SKIP
    with tempfile.TemporaryDirectory() as d:
        last = os.path.join(d, "qwen3-embedding-last.gguf")
        family_gguf.write_family_gguf(last, "qwen3", pooling="last")
        check_model(a, last, LAST, "qwen3 last-token", openai, np, ref)
        mean = os.path.join(d, "llama-mean.gguf")
        family_gguf.write_family_gguf(mean, "llama", pooling="mean")
        check_model(a, mean, MEAN, "llama mean", openai, np, ref)
        plain = os.path.join(d, "qwen3.gguf")
        family_gguf.write_family_gguf(plain, "qwen3")
        proc, port = start_server(a.tandem, plain)
        try:
            code, data = raw(port, "POST", "/v1/embeddings", json.dumps({"input": "hi"}).encode())
            msg = json.loads(data).get("error", {}).get("message", "")
            check(code == 400 and "not an embedding model" in msg, f"a generation-only model: 400 saying why ({msg[:60]})")
        finally:
            proc.kill()
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
