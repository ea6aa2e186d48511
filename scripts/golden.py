#!/usr/bin/python3
"""Golden fixtures from PyTorch, for tests/golden/golden_test.cpp.

Writes tests/golden/fixtures/*.safetensors: what PyTorch computes for
  model_<variant>   a tiny GPT's loss and gradients on a fixed batch, for two architecture variants
                    (rmsnorm + rope + gelu; layernorm + learned positions + swiglu + qk-norm), and a
                    tiny Llama's (grouped-query attention, q/k/v biases, an untied head), with
                    z-loss; written here from the equations, independently of loco's C++ code
  adamw             three torch.optim.AdamW steps (weight decay on the matrix only)
  nesterov          three outer steps of torch.optim.SGD(nesterov=True) on outer gradients
  merge             one Streaming DiLoCo fragment sync: Nesterov outer step, then the merge
                    θ_m ← α·θ_m(t+τ) + (1 − α)·θ̃

The fixtures are committed; the C++ tests read them and need no Python. To write them again:
    apt-get install python3-torch && /usr/bin/python3 scripts/golden.py
(Debian 12 has no python3-safetensors; the format, an 8-byte header length, a JSON header and the
raw bytes, is written below.)
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "fixtures")
DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}


def save(name, tensors, metadata, folder=None):
    header, blobs, offset = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, [], 0
    for key in sorted(tensors):
        t = tensors[key].detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    folder = folder or OUT
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    print(f"wrote {os.path.relpath(os.path.join(folder, name))}.safetensors ({len(tensors)} tensors)")


# --- the model, from its equations ----------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):  # "rotate half": x = [x1, x2] -> [x1 c - x2 s, x2 c + x1 s]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def forward_loss(p, tokens, targets, o):
    B, T = tokens.shape
    C, H = o["width"], o["heads"]
    hd = C // H
    norm = (lambda x, name: rms_norm(x, p[name + ".rms.weight"], o["eps"])) if o["norm"] == "rmsnorm" else \
           (lambda x, name: F.layer_norm(x, (C,), p[name + ".ln.weight"], p[name + ".ln.bias"], o["eps"]))
    x = p["tok_emb.weight"][tokens]
    if o["position"] == "learned":
        x = x + p["pos_emb.weight"][:T]
    else:
        half = hd // 2
        inv_freq = o["rope_base"] ** (-torch.arange(0, half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(0, T, dtype=torch.float64), inv_freq)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(o["layers"]):
        b = f"blocks.{i}."
        h = norm(x, b + "norm1")
        q, k, v = (h @ p[b + "attn.qkv.weight"].T).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        if o["qk_norm"]:
            q = rms_norm(q, p[b + "attn.q_norm.weight"], o["eps"])
            k = rms_norm(k, p[b + "attn.k_norm.weight"], o["eps"])
        if o["position"] == "rope":
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = torch.softmax(scores.masked_fill(causal, float("-inf")), -1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, C) @ p[b + "attn.proj.weight"].T
        h = norm(x, b + "norm2")
        if o["mlp"] == "swiglu":
            m = F.silu(h @ p[b + "mlp.gate.weight"].T) * (h @ p[b + "mlp.up.weight"].T)
        else:
            m = F.gelu(h @ p[b + "mlp.up.weight"].T, approximate="tanh")
        x = x + m @ p[b + "mlp.down.weight"].T
    logits = norm(x, "final_norm") @ p["tok_emb.weight"].T
    flat = logits.reshape(-1, logits.shape[-1])
    ce = F.cross_entropy(flat, targets.reshape(-1))
    return ce + o["z_loss"] * torch.logsumexp(flat, -1).pow(2).mean(), ce


def llama_forward_loss(p, tokens, targets, o):
    flat = llama_logits(p, tokens, o).reshape(-1, o["vocab"])
    ce = F.cross_entropy(flat, targets.reshape(-1))
    return ce + o["z_loss"] * torch.logsumexp(flat, -1).pow(2).mean(), ce


def rope_inverse_frequencies(o, hd):
    """RoPE's inverse frequencies with Hugging Face's rope_scaling (modeling_rope_utils): none,
    "linear" (all divided by the factor) or "llama3" (Llama 3.1: wavelengths longer than
    original / low_freq_factor divided by the factor, shorter than original / high_freq_factor
    kept, and a linear blend in 1 / wavelength between)."""
    inv_freq = 1.0 / (o["rope_base"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    scaling = o.get("rope_scaling")
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high, original = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["original_max_position_embeddings"]
    out = []
    for f in inv_freq.tolist():
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            out.append(f)
        elif wavelength > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def llama_logits(p, tokens, o):
    """The Llama architecture as Hugging Face's LlamaForCausalLM computes it (RMSNorm, rotary
    embeddings in the rotate-half form, grouped-query attention whose key/value heads are repeated
    as repeat_kv does, SwiGLU, an output head of its own), with Qwen2's q/k/v biases. The query,
    key and value projections are the rows of loco's fused attn.qkv, cut apart here."""
    B, T = tokens.shape
    C, H, KV = o["width"], o["heads"], o["kv_heads"]
    hd, n_rep = C // H, H // KV
    x = p["tok_emb.weight"][tokens]
    half = hd // 2
    angles = torch.outer(torch.arange(0, T, dtype=torch.float64), rope_inverse_frequencies(o, hd))
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)

    def repeat_kv(t):  # (B, KV, T, hd) -> (B, H, T, hd), each head n_rep times in a row
        return t[:, :, None, :, :].expand(B, KV, n_rep, T, hd).reshape(B, H, T, hd)

    for i in range(o["layers"]):
        b = f"blocks.{i}."
        h = rms_norm(x, p[b + "norm1.rms.weight"], o["eps"])
        w, bias = p[b + "attn.qkv.weight"], p[b + "attn.qkv.bias"]
        wq, wk, wv = w[:C], w[C:C + KV * hd], w[C + KV * hd:]
        bq, bk, bv = bias[:C], bias[C:C + KV * hd], bias[C + KV * hd:]
        q = (h @ wq.T + bq).view(B, T, H, hd).transpose(1, 2)
        k = (h @ wk.T + bk).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ wv.T + bv).view(B, T, KV, hd).transpose(1, 2)
        q, k = rope(q, cos[:, :half], sin[:, :half]), rope(k, cos[:, :half], sin[:, :half])
        k, v = repeat_kv(k), repeat_kv(v)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = torch.softmax(scores.masked_fill(causal, float("-inf")), -1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, C) @ p[b + "attn.proj.weight"].T
        h = rms_norm(x, p[b + "norm2.rms.weight"], o["eps"])
        x = x + (F.silu(h @ p[b + "mlp.gate.weight"].T) * (h @ p[b + "mlp.up.weight"].T)) @ p[b + "mlp.down.weight"].T
    return rms_norm(x, p["final_norm.rms.weight"], o["eps"]) @ p["lm_head.weight"].T


def llama_shapes(o):
    C, V, KV, hd, hidden = o["width"], o["vocab"], o["kv_heads"], o["width"] // o["heads"], o["mlp_hidden"]
    shapes = {"tok_emb.weight": (V, C)}
    for i in range(o["layers"]):
        b = f"blocks.{i}."
        shapes[b + "norm1.rms.weight"] = (C,)
        shapes[b + "attn.qkv.weight"] = (C + 2 * KV * hd, C)
        shapes[b + "attn.qkv.bias"] = (C + 2 * KV * hd,)
        shapes[b + "attn.proj.weight"] = (C, C)
        shapes[b + "norm2.rms.weight"] = (C,)
        shapes[b + "mlp.up.weight"] = (hidden, C)
        shapes[b + "mlp.gate.weight"] = (hidden, C)
        shapes[b + "mlp.down.weight"] = (C, hidden)
    shapes["final_norm.rms.weight"] = (C,)
    shapes["lm_head.weight"] = (V, C)
    return shapes


def hugging_face_fixture(name, o):
    """A tiny Qwen2-style model in Hugging Face's layout (config.json, two shards, their index; q/k/v
    biases, grouped-query attention, an untied head), with its logits on a fixed batch from
    llama_forward_loss: what loco must compute after reading the folder (train.init_from)."""
    g = torch.Generator().manual_seed(o["seed"])
    loco = {k: (0.2 * torch.randn(shape, generator=g) if len(shape) == 2 or k.endswith(".bias")
                else 1 + 0.1 * torch.randn(shape, generator=g)).float() for k, shape in llama_shapes(o).items()}
    C, hd, KV = o["width"], o["width"] // o["heads"], o["kv_heads"]
    hf = {"model.embed_tokens.weight": loco["tok_emb.weight"], "model.norm.weight": loco["final_norm.rms.weight"],
          "lm_head.weight": loco["lm_head.weight"]}
    for i in range(o["layers"]):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        w, bias = loco[b + "attn.qkv.weight"], loco[b + "attn.qkv.bias"]
        for part, rows in (("q", slice(0, C)), ("k", slice(C, C + KV * hd)), ("v", slice(C + KV * hd, None))):
            hf[h + f"self_attn.{part}_proj.weight"] = w[rows]
            hf[h + f"self_attn.{part}_proj.bias"] = bias[rows]
        hf[h + "self_attn.o_proj.weight"] = loco[b + "attn.proj.weight"]
        hf[h + "input_layernorm.weight"] = loco[b + "norm1.rms.weight"]
        hf[h + "post_attention_layernorm.weight"] = loco[b + "norm2.rms.weight"]
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            hf[h + f"mlp.{theirs}.weight"] = loco[b + f"mlp.{ours}.weight"]
    folder = os.path.join(OUT, name)
    shards = [{k: v for k, v in hf.items() if not k.startswith("model.layers.1.")},
              {k: v for k, v in hf.items() if k.startswith("model.layers.1.")}]
    weight_map = {}
    for n, shard in enumerate(shards):
        file = f"model-{n + 1:05d}-of-{len(shards):05d}"
        save(file, shard, {"format": "pt"}, folder)
        weight_map.update({k: file + ".safetensors" for k in shard})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(4 * v.numel() for v in hf.values())}, "weight_map": weight_map}, f,
                  indent=2, sort_keys=True)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "vocab_size": o["vocab"], "hidden_size": C, "num_hidden_layers": o["layers"],
              "num_attention_heads": o["heads"], "num_key_value_heads": KV, "intermediate_size": o["mlp_hidden"],
              "rms_norm_eps": o["eps"], "rope_theta": o["rope_base"], "max_position_embeddings": 32,
              "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4,
              "torch_dtype": "float32"}
    if o.get("rope_scaling"):
        config["rope_scaling"] = o["rope_scaling"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    tokens = torch.randint(0, o["vocab"], (o["batch"], o["context"]), generator=g)
    logits = llama_logits({k: w.double() for k, w in loco.items()}, tokens, o)
    save("reference", {"tokens": tokens, "logits": logits}, {"config": "config.json"}, folder)


def model_fixture(name, o):
    g = torch.Generator().manual_seed(o["seed"])
    C, V, hidden = o["width"], o["vocab"], round(o["mlp_ratio"] * o["width"])
    shapes = {"tok_emb.weight": (V, C)}
    if o["position"] == "learned":
        shapes["pos_emb.weight"] = (o["context"], C)
    norm_params = lambda n: {n + ".rms.weight": (C,)} if o["norm"] == "rmsnorm" else {n + ".ln.weight": (C,), n + ".ln.bias": (C,)}
    for i in range(o["layers"]):
        b = f"blocks.{i}."
        shapes.update(norm_params(b + "norm1"))
        shapes[b + "attn.qkv.weight"] = (3 * C, C)
        shapes[b + "attn.proj.weight"] = (C, C)
        if o["qk_norm"]:
            shapes[b + "attn.q_norm.weight"] = (C // o["heads"],)
            shapes[b + "attn.k_norm.weight"] = (C // o["heads"],)
        shapes.update(norm_params(b + "norm2"))
        shapes[b + "mlp.up.weight"] = (hidden, C)
        if o["mlp"] == "swiglu":
            shapes[b + "mlp.gate.weight"] = (hidden, C)
        shapes[b + "mlp.down.weight"] = (C, hidden)
    shapes.update(norm_params("final_norm"))
    if o.get("architecture") == "llama":
        shapes = llama_shapes(o)
    weights = {}
    for key, shape in shapes.items():
        if len(shape) == 2:
            w = 0.2 * torch.randn(shape, generator=g)  # larger than the init: activations that matter
        elif key.endswith(".bias"):
            w = 0.1 * torch.randn(shape, generator=g)
        else:
            w = 1 + 0.1 * torch.randn(shape, generator=g)
        weights[key] = w.float()
    tokens = torch.randint(0, V, (o["batch"], o["context"]), generator=g)
    targets = torch.randint(0, V, (o["batch"], o["context"]), generator=g)
    # The reference runs in float64 from the float32 weights: loco's float32 results are compared
    # against it.
    p = {k: w.double().requires_grad_(True) for k, w in weights.items()}
    loss, ce = (llama_forward_loss if o.get("architecture") == "llama" else forward_loss)(p, tokens, targets, o)
    loss.backward()
    tensors = {"param." + k: w for k, w in weights.items()}
    tensors.update({"grad." + k: v.grad for k, v in p.items()})
    tensors.update({"tokens": tokens, "targets": targets, "loss": loss.detach().reshape(1),
                    "cross_entropy": ce.detach().reshape(1)})
    meta = {k: v for k, v in o.items()}
    save(name, tensors, meta)


def adamw_fixture():
    g = torch.Generator().manual_seed(11)
    matrix, vector = torch.randn(5, 4, generator=g), torch.randn(7, generator=g)
    grads = [(torch.randn(5, 4, generator=g), torch.randn(7, generator=g)) for _ in range(3)]
    lrs = [1e-2, 3e-2, 2e-2]
    a, b = matrix.clone().requires_grad_(True), vector.clone().requires_grad_(True)
    opt = torch.optim.AdamW([{"params": [a], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                            lr=lrs[0], betas=(0.9, 0.95), eps=1e-8)
    for (ga, gb), lr in zip(grads, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        a.grad, b.grad = ga.clone(), gb.clone()
        opt.step()
    tensors = {"matrix": matrix, "vector": vector, "lr": torch.tensor(lrs, dtype=torch.float64),
               "matrix.after": a.detach(), "vector.after": b.detach()}
    for i, (ga, gb) in enumerate(grads):
        tensors[f"matrix.grad.{i}"], tensors[f"vector.grad.{i}"] = ga, gb
    save("adamw", tensors, {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1})


def nesterov_steps(theta, deltas, lr, momentum):
    p = theta.clone().requires_grad_(True)
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum, nesterov=True)
    for d in deltas:
        p.grad = d.clone()
        opt.step()
    return p.detach()


def nesterov_fixture():
    g = torch.Generator().manual_seed(12)
    theta = torch.randn(6, 3, generator=g)
    deltas = [0.1 * torch.randn(6, 3, generator=g) for _ in range(3)]
    tensors = {"theta": theta, "theta.after": nesterov_steps(theta, deltas, 0.7, 0.9)}
    for i, d in enumerate(deltas):
        tensors[f"delta.{i}"] = d
    save("nesterov", tensors, {"lr": 0.7, "momentum": 0.9})


def merge_fixture():
    # One worker, one fragment, H = 2, τ = 1: the sync starts at step 2 with θ_m(2), its outer step
    # is Nesterov on Δ = θ − θ_m(2), and at step 3 the model becomes α·θ_m(3) + (1 − α)·θ̃.
    g = torch.Generator().manual_seed(13)
    theta = torch.randn(10, generator=g)
    at_start = theta + 0.1 * torch.randn(10, generator=g)
    at_merge = at_start + 0.1 * torch.randn(10, generator=g)
    alpha = 0.5
    outer = nesterov_steps(theta, [theta - at_start], 0.7, 0.9)
    merged = alpha * at_merge + (1 - alpha) * outer
    save("merge", {"theta": theta, "model.at_start": at_start, "model.at_merge": at_merge,
                   "theta.after": outer, "model.after": merged},
         {"alpha": alpha, "lr": 0.7, "momentum": 0.9})


if __name__ == "__main__":
    torch.set_num_threads(1)
    base = {"vocab": 64, "context": 8, "layers": 2, "width": 16, "heads": 2, "mlp_ratio": 4.0, "eps": 1e-5,
            "rope_base": 10000.0, "batch": 3, "z_loss": 1e-4}
    model_fixture("model_rmsnorm_rope_gelu", dict(base, norm="rmsnorm", position="rope", mlp="gelu", qk_norm=False, seed=1))
    model_fixture("model_layernorm_learned_swiglu_qknorm",
                  dict(base, norm="layernorm", position="learned", mlp="swiglu", qk_norm=True, seed=2))
    model_fixture("model_llama_gqa_bias_untied",
                  dict(base, architecture="llama", heads=4, kv_heads=2, mlp_hidden=24, norm="rmsnorm", position="rope",
                       mlp="swiglu", qk_norm=False, seed=3))
    hugging_face_fixture("hf_qwen2", dict(base, heads=4, kv_heads=2, mlp_hidden=24, seed=4))
    # Llama 3.1's rotary scaling, on head dimension 8: frequencies 1, 0.1, 0.01, 0.001 fall in the
    # kept, blended and divided bands of an original context of 64.
    hugging_face_fixture("hf_qwen2_llama3_rope", dict(base, width=32, heads=4, kv_heads=2, mlp_hidden=24, seed=5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}))
    adamw_fixture()
    nesterov_fixture()
    merge_fixture()
