"""An independent reference for Hugging Face Llama's forward, in numpy (float64).

Used by tests/tests/llama_safetensors_cli.rs to check that `zero-bench ckpt export
--names hf-llama` and `train --init-from` agree with `transformers`' LlamaForCausalLM on
what each tensor means. Written from HF's modeling_llama, not from our code: RMSNorm
(x / sqrt(mean(x^2) + eps) * w), rotary embeddings with `rotate_half` (channel i paired
with i + hd/2), grouped-query attention with `repeat_kv` (query head h reads key/value
head h // (H / Hkv)), causal softmax attention scaled by 1/sqrt(hd), SwiGLU
(down(silu(gate x) * up x)), final norm, `lm_head` (the embedding when the file has
none, as with `tie_word_embeddings`).

The safetensors file is parsed by hand: an 8-byte little-endian header length n, n bytes
of JSON (dtype, shape, data_offsets per tensor), then the raw little-endian data.

usage: hf_llama_ref.py MODEL.safetensors BATCH.json
BATCH.json: {"inputs": [[tok, ...], ...], "targets": [[...], ...],
             "n_head": H, "n_kv_head": Hkv, "rope_theta": theta, "norm_eps": eps}
Prints one JSON line: the mean cross-entropy under HF's conventions ("hf") and under
two wrong ones that a layout mistake would amount to: Meta's interleaved rotary pairs
(2i, 2i+1) without the q/k permutation ("interleaved_rope"), and key/value heads shared
round-robin instead of in groups ("tiled_kv").
"""

import json
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        begin, end = t["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype="<f4").reshape(t["shape"])
        out[name] = a.astype(np.float64)
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope(x, theta, interleaved):
    """x: [B, heads, T, hd], rotated by position t."""
    t, hd = x.shape[2], x.shape[3]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)
    if not interleaved:
        cos2 = np.concatenate([cos, cos], axis=-1)
        sin2 = np.concatenate([sin, sin], axis=-1)
        return x * cos2 + rotate_half(x) * sin2
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = x0 * cos - x1 * sin
    y[..., 1::2] = x1 * cos + x0 * sin
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def loss(w, batch, interleaved=False, tiled_kv=False):
    inputs = np.array(batch["inputs"])
    targets = np.array(batch["targets"])
    h_q, h_kv = batch["n_head"], batch["n_kv_head"]
    theta, eps = batch["rope_theta"], batch["norm_eps"]
    b, t = inputs.shape
    x = w["model.embed_tokens.weight"][inputs]  # [B, T, C]
    c = x.shape[-1]
    hd = c // h_q
    n_layer = 0
    while f"model.layers.{n_layer}.input_layernorm.weight" in w:
        n_layer += 1
    assert n_layer > 0
    causal = np.triu(np.full((t, t), -np.inf), k=1)
    for i in range(n_layer):
        p = lambda n: w[f"model.layers.{i}.{n}"]
        a = rms_norm(x, p("input_layernorm.weight"), eps)
        q = (a @ p("self_attn.q_proj.weight").T).reshape(b, t, h_q, hd).transpose(0, 2, 1, 3)
        k = (a @ p("self_attn.k_proj.weight").T).reshape(b, t, h_kv, hd).transpose(0, 2, 1, 3)
        v = (a @ p("self_attn.v_proj.weight").T).reshape(b, t, h_kv, hd).transpose(0, 2, 1, 3)
        q, k = rope(q, theta, interleaved), rope(k, theta, interleaved)
        if tiled_kv:
            k, v = np.tile(k, (1, h_q // h_kv, 1, 1)), np.tile(v, (1, h_q // h_kv, 1, 1))
        else:  # repeat_kv
            k, v = np.repeat(k, h_q // h_kv, axis=1), np.repeat(v, h_q // h_kv, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + causal
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        y = (s @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + y @ p("self_attn.o_proj.weight").T
        m = rms_norm(x, p("post_attention_layernorm.weight"), eps)
        g = silu(m @ p("mlp.gate_proj.weight").T) * (m @ p("mlp.up_proj.weight").T)
        x = x + g @ p("mlp.down_proj.weight").T
    x = rms_norm(x, w["model.norm.weight"], eps)
    # tie_word_embeddings: HF saves no lm_head, the head is the embedding.
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = x @ head.T  # [B, T, V]
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)
    return float(nll.mean())


def main():
    model, batch_file = sys.argv[1], sys.argv[2]
    w = read_safetensors(model)
    with open(batch_file) as f:
        batch = json.load(f)
    print(
        json.dumps(
            {
                "hf": loss(w, batch),
                "interleaved_rope": loss(w, batch, interleaved=True),
                "tiled_kv": loss(w, batch, tiled_kv=True),
            }
        )
    )


if __name__ == "__main__":
    main()
