"""What record_peer_greedy.py records and replay_peer_greedy.py replays: the models of
tests/data/peer_greedy_<name>.json, each either a file in the tree (the real Gemma 3) or a recipe
for family_gguf.py that rebuilds a random-weight model byte for byte (its sha256 is recorded)."""
import hashlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")

# name -> how to get the model, and the cases. Random prompts are seeded draws of token ids (the
# forward pass is under test, not the tokenizer); a text prompt is tokenized by the peer.
# The 2B+ shapes (granite-3.1-2b: 1.4 GB as Q4_0, phi3-mini: 3.8B parameters, 2.2 GB) take minutes
# to write on 2 cores and are opt-in for the replay (replay_peer_greedy.py --opt-in).
MODELS = {
    # Llama (SmolLM2, the bundled model): replayable today, and the recording of ids that
    # peer_greedy_smollm2.json (text, for test_real_model.cpp) lacks.
    "llama": dict(path="models/SmolLM2-135M-Instruct.Q4_1.gguf",
                  prompts=["The capital of France is", "Once upon a time, in a small village,",
                           "The three primary colors are"], n=64),
    "gemma3": dict(path="models/gemma-3-270m-q4_k_m.gguf",
                   prompts=["The capital of France is", "Once upon a time, in a small village,",
                            "The three primary colors are"], n=64),
    "qwen2": dict(recipe=dict(family="qwen2", shape="qwen2.5-0.5b", type="q8_0", seed=0), n=48),
    "qwen3": dict(recipe=dict(family="qwen3", shape="qwen3-0.6b", type="q8_0", seed=0), n=48),
    # Real shape but a 32-token window (the real 512 is out of reach of a 96-token check), so the
    # local layers' window and the global layers (5, 11, 17) both shape the answer.
    "gemma3_random": dict(recipe=dict(family="gemma3", shape="gemma3-270m", type="q8_0", seed=0, window=32), n=48),
    # Mixtures of experts, tiny shapes (8 experts, 2-4 used; a real shape's expert tensors are
    # gigabytes): routing, renormalising or not, the shared expert, Mixtral's llama layout.
    "qwen3moe": dict(recipe=dict(family="qwen3moe", shape="tiny", type="q8_0", seed=0), n=48),
    "olmoe": dict(recipe=dict(family="olmoe", shape="tiny", type="q8_0", seed=0), n=48),
    "qwen2moe": dict(recipe=dict(family="qwen2moe", shape="tiny", type="q8_0", seed=0), n=48),
    "mixtral": dict(recipe=dict(family="mixtral", shape="tiny", type="q8_0", seed=0), n=48),
    # Its experts in MXFP4 (family_gguf.py's default for gpt-oss), attention in q8_0.
    "gpt_oss": dict(recipe=dict(family="gpt-oss", shape="tiny", type="q8_0", seed=0), n=48),
    "granite": dict(recipe=dict(family="granite", shape="granite-3.1-2b", type="q4_0", seed=0), n=48, opt_in=True),
    "phi3": dict(recipe=dict(family="phi3", shape="phi3-mini", type="q4_0", seed=0), n=48, opt_in=True),
}
RANDOM_PROMPTS = [dict(seed=1, length=48), dict(seed=2, length=48)]


def recipe_file(recipe):
    r = recipe
    return f"{r['family']}-{r['shape']}-{r['type']}-seed{r['seed']}" + (f"-window{r['window']}" if r.get("window") else "") + ".gguf"


def build(recipe, path):
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from family_gguf import write_family_gguf
    tmp = path + ".part"
    write_family_gguf(tmp, recipe["family"], recipe["shape"], recipe["type"], recipe["seed"], recipe.get("window"))
    os.replace(tmp, path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def random_prompt(n_vocab, bos, seed, length):
    import numpy as np
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, length - 1)]
    return [int(bos)] + ids
