"""Shared pieces of the demo-model training scripts (tools/train/, models/README.md): the shapes of the demo
pair, config builders for HF transformers 5.17's own Gemma 4 classes (so the saved layout is the real one,
spec §3), data loading, the target features the drafter consumes in tandem's clean mode (spec box, §4.2-§4.4,
§5.6) and the batched, unrolled drafter forward used to train it (checked against HF's
Gemma4AssistantForCausalLM.forward in train_drafter.py before and after training).
"""

import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

SLIDING = "sliding_attention"
FULL = "full_attention"

VOCAB = 4096
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
# Gemma 4 chat / tool markers (spec §2.3), ids 4..15 in the demo tokenizer.
CHAT_TOKENS = ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
               "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>", '<|"|>']

# E-style target (like E2B): per-layer embeddings, the last 2 layers KV-shared with double-wide MLPs.
TARGET = dict(
    hidden=512, layer_types=[SLIDING] * 3 + [FULL] + [SLIDING] * 3 + [FULL], heads=8, kv_heads=2, head_dim=64,
    global_head_dim=128, d_ff=768, kv_shared=2, ple_dim=64, window=128, max_pos=4096, softcap=30.0,
)
# Assistant drafter: 4 KV-shared layers over the target's K/V, centroid-routed LM head (like E2B's).
DRAFTER = dict(hidden=256, layer_types=[SLIDING] * 3 + [FULL], heads=4, d_ff=512, num_centroids=64,
               centroid_top_k=8)

TARGET_MAX_BYTES = 47_000_000
DRAFTER_MAX_BYTES = 9_000_000


def log(msg=""):
    print(msg, flush=True)


class Timer:
    def __init__(self):
        self.t0 = time.time()

    def __call__(self):
        return time.time() - self.t0


def setup_torch(seed):
    import transformers
    torch.manual_seed(seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {name}")
    if not transformers.__version__.startswith("5.17"):
        log(f"WARNING: written against transformers 5.17, running {transformers.__version__}")
    return dev


def save_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ------------------------------------------------------------------------------------------------ data

def read_chapters(path):
    """Chapters of a prepare_data.py text file (verses one a line, chapters separated by a blank line)."""
    with open(path, encoding="utf-8") as f:
        return [c.strip("\n") for c in f.read().split("\n\n") if c.strip()]


def load_tokenizer(path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


def encode_stream(tok, path):
    """One LongTensor: every chapter as <bos> (from the post-processor) + tokens + <eos>, concatenated."""
    ids = []
    for enc in tok.encode_batch(read_chapters(path)):
        assert enc.ids[0] == BOS_ID
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def read_prompts(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def random_windows(stream, n, length, gen=None):
    """n random windows of `length` tokens from a 1-D token stream (same device as the stream)."""
    off = torch.randint(0, stream.numel() - length, (n,), generator=gen, device="cpu").to(stream.device)
    return stream[off[:, None] + torch.arange(length, device=stream.device)[None, :]]


# --------------------------------------------------------------------------------------------- configs

def make_config(cls, **kwargs):
    """Config constructor; from_dict if this version's strict dataclass rejects the extra keys
    (global_head_dim is consumed by Gemma4TextConfig.__post_init__ into per_layer_config)."""
    try:
        return cls(**kwargs)
    except TypeError as e:
        log(f"  note: {cls.__name__}(**kwargs) raised {e}; retrying with from_dict")
        return cls.from_dict(kwargs)


def _full_head_dim(cfg, layer):
    """head_dim that the config resolves for `layer` (HF's attention reads config.per_layer_config[i].head_dim);
    None if it cannot be read here (the model-level structure checks decide then)."""
    plc = getattr(cfg, "per_layer_config", None)
    for key in (layer, str(layer)):
        try:
            entry = plc[key]
        except Exception:  # noqa: BLE001
            continue
        value = entry.get("head_dim") if isinstance(entry, dict) else getattr(entry, "head_dim", None)
        if value is not None:
            return value
    return None


def text_config(global_head_dim, **kwargs):
    """Gemma4TextConfig with full-attention head dim `global_head_dim`, given the release way (global_head_dim,
    turned into per_layer_config by __post_init__); if this version did not apply it, the 5.x native way
    (per_layer_config {layer index: {"head_dim": ...}}, spec box at the top)."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    full = [i for i, t in enumerate(kwargs["layer_types"]) if t == FULL]
    cfg = make_config(Gemma4TextConfig, global_head_dim=global_head_dim, **kwargs)
    got = [_full_head_dim(cfg, i) for i in full]
    if all(g == global_head_dim for g in got):
        return cfg
    if all(g is None for g in got):
        log("  note: per_layer_config not readable here; the model structure check verifies the head dims")
        return cfg
    log(f"  WARNING: global_head_dim={global_head_dim} not applied ({got}); passing per_layer_config instead")
    cfg = make_config(Gemma4TextConfig, per_layer_config={i: {"head_dim": global_head_dim} for i in full}, **kwargs)
    got = [_full_head_dim(cfg, i) for i in full]
    assert all(g == global_head_dim for g in got), f"full-attention head dims {got}, expected {global_head_dim}"
    return cfg


def target_config():
    t = TARGET
    return text_config(
        t["global_head_dim"],
        vocab_size=VOCAB, hidden_size=t["hidden"], intermediate_size=t["d_ff"],
        num_hidden_layers=len(t["layer_types"]), num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
        head_dim=t["head_dim"], hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=t["max_pos"], rms_norm_eps=1e-6, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
        bos_token_id=BOS_ID, tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
        sliding_window=t["window"], layer_types=list(t["layer_types"]), final_logit_softcapping=t["softcap"],
        vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=t["ple_dim"], attention_k_eq_v=False,
        num_kv_shared_layers=t["kv_shared"], enable_moe_block=False, use_double_wide_mlp=True,
    )


def publisher_layers(model_text):
    """{layer type: index of the target layer whose K/V HF publishes as shared_kv_states} (spec §1.8)."""
    pubs = {}
    for i, layer in enumerate(model_text.layers):
        if layer.self_attn.store_full_length_kv:
            pubs[layer.self_attn.layer_type] = i
    return pubs


def drafter_config(target):
    """Assistant config whose head dims, KV heads, window and RoPE equal the target's (spec §2.2, §4.2)."""
    import copy
    from transformers.models.gemma4_assistant.configuration_gemma4_assistant import Gemma4AssistantConfig
    tc, d = target.config, DRAFTER
    pubs = publisher_layers(target.model)
    s_attn = target.model.layers[pubs[SLIDING]].self_attn
    f_attn = target.model.layers[pubs[FULL]].self_attn
    kv_heads = tc.num_attention_heads // s_attn.num_key_value_groups
    assert tc.num_attention_heads // f_attn.num_key_value_groups == kv_heads, "full/sliding KV heads differ"
    text = text_config(
        f_attn.head_dim,
        vocab_size=tc.vocab_size, hidden_size=d["hidden"], intermediate_size=d["d_ff"],
        num_hidden_layers=len(d["layer_types"]), num_attention_heads=d["heads"], num_key_value_heads=kv_heads,
        head_dim=s_attn.head_dim, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps, pad_token_id=PAD_ID,
        eos_token_id=EOS_ID, bos_token_id=BOS_ID, tie_word_embeddings=True, attention_bias=False,
        attention_dropout=0.0, sliding_window=tc.sliding_window, layer_types=list(d["layer_types"]),
        rope_parameters=copy.deepcopy(dict(tc.rope_parameters)), final_logit_softcapping=None,
        vocab_size_per_layer_input=0, hidden_size_per_layer_input=0, attention_k_eq_v=False,
        num_kv_shared_layers=len(d["layer_types"]), enable_moe_block=False, use_double_wide_mlp=False,
    )
    return make_config(
        Gemma4AssistantConfig, text_config=text, backbone_hidden_size=tc.hidden_size, use_ordered_embeddings=True,
        num_centroids=d["num_centroids"], centroid_intermediate_top_k=d["centroid_top_k"], tie_word_embeddings=True,
    )


# ---------------------------------------------------------------------------------------- model helpers

def ensure_tied(model):
    """lm_head.weight must be the (input) embedding table itself (tie_word_embeddings, spec §1.11, §4.7)."""
    emb = model.model.embed_tokens.weight
    if model.lm_head.weight.data_ptr() != emb.data_ptr():
        log("  note: lm_head was not tied after construction; tying it to model.embed_tokens")
        model.lm_head.weight = emb
    assert model.lm_head.weight.data_ptr() == emb.data_ptr(), "lm_head not tied"


def softcap(x, cap):
    return x if cap is None else torch.tanh(x / cap) * cap


def fp32_head(h, weight, cap=None):
    """h @ weight^T (+ soft-cap) in fp32, also inside an autocast region (autocast would run F.linear in bf16)."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        return softcap(F.linear(h.float(), weight.float()), cap)


def layer_scalars_to_params(model):
    """HF registers layers.N.layer_scalar as a buffer (init 1); real checkpoints hold learned values (spec §1.5),
    so the demo models learn it too. Same state-dict name, so the saved layout is unchanged."""
    params = []
    for layer in model.model.layers:
        p = torch.nn.Parameter(layer.layer_scalar.detach().clone().float())
        layer.layer_scalar = p  # nn.Module.__setattr__ moves the name from _buffers to _parameters
        params.append(p)
    return params


def layer_scalars_to_buffers(model):
    for layer in model.model.layers:
        v = layer.layer_scalar.detach().clone()
        del layer.layer_scalar
        layer.register_buffer("layer_scalar", v)


def param_groups(model, lr, weight_decay, scalar_lr_mult=0.1):
    """AdamW groups: decay on matrices, none on norms; layer scalars with a smaller learning rate."""
    decay, no_decay, scalars = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("layer_scalar"):
            scalars.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "lr": lr, "base_lr": lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": lr, "base_lr": lr},
        {"params": scalars, "weight_decay": 0.0, "lr": lr * scalar_lr_mult, "base_lr": lr * scalar_lr_mult},
    ]


def make_adamw(groups):
    try:
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (TypeError, RuntimeError):
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8)


def schedule(opt, step, progress, warmup_steps, min_ratio=0.1):
    """Linear warmup, then cosine to min_ratio over progress in [0, 1] (max of step and time fractions)."""
    warm = min(1.0, (step + 1) / warmup_steps)
    cos = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * warm * cos
    return opt.param_groups[0]["lr"]


def saved_bytes(model):
    """Bytes of the safetensors payload once saved in bf16 (tied weights once, int buffers as they are)."""
    seen, total = set(), 0
    for t in list(model.state_dict(keep_vars=True).values()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * (2 if t.is_floating_point() else t.element_size())
    return total


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def write_generation_config(folder, extra=None):
    cfg = {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID], "pad_token_id": PAD_ID}
    cfg.update(extra or {})
    save_json(os.path.join(folder, "generation_config.json"), cfg)


def copy_tokenizer(tok_dir, folder):
    import shutil
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(folder, name))


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


# ------------------------------------------------------------------------------------ target features

@torch.no_grad()
def target_features(target, x):
    """Everything the drafter reads from one target forward over x [B, T] (no cache):
    emb    [B, T, H]  scaled input embedding of each token (target.model.embed_tokens, spec §1.3, §4.2)
    h      [B, T, H]  post-final-norm hidden (last_hidden_state, spec §4.3)
    kv     {type: (K, V)} each [B, n_kv, T, d], the shared K/V HF publishes (spec §4.4)
    labels [B, T]     target greedy token after each position (argmax of the soft-capped logits)"""
    out = target.model(input_ids=x, use_cache=False, return_shared_kv_states=True)
    h = out.last_hidden_state
    skv = out.shared_kv_states
    assert skv is not None and set(skv.keys()) == {SLIDING, FULL}, f"shared_kv_states: {skv and list(skv.keys())}"
    logits = fp32_head(h, target.lm_head.weight, target.config.final_logit_softcapping)
    return {
        "emb": target.model.embed_tokens(x),
        "h": h,
        "kv": {k: (v[0], v[1]) for k, v in skv.items()},
        "labels": logits.argmax(-1),
    }


def slice_features(feats, rows):
    return {
        "emb": feats["emb"][rows], "h": feats["h"][rows], "labels": feats["labels"][rows],
        "kv": {k: (v[0][rows], v[1][rows]) for k, v in feats["kv"].items()},
    }


def features_to(feats, dtype):
    return {
        "emb": feats["emb"].to(dtype), "h": feats["h"].to(dtype), "labels": feats["labels"],
        "kv": {k: (v[0].to(dtype), v[1].to(dtype)) for k, v in feats["kv"].items()},
    }


# --------------------------------------------------------------------------- batched drafter (training)

def query_masks(T, n_sliding_keys, device):
    """Attention masks [T, T] (True = attend) for drafter queries at every position P = row: the clean-mode
    drafter at query position P sees the target K/V of positions [0, P) on the full layer and the newest
    n_sliding_keys of them on the sliding layers (HF: W+1, spec §4.6). Row 0 (P = 0) has no key at all; it is a
    dummy that never enters the loss, given key 0 so the softmax stays finite."""
    r = torch.arange(T, device=device)[:, None]
    k = torch.arange(T, device=device)[None, :]
    full = k < r
    sliding = full & (k >= r - n_sliding_keys)
    full[0, 0] = True
    sliding[0, 0] = True
    return {FULL: full, SLIDING: sliding}


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def drafter_unrolled(drafter, feats, steps, n_sliding_keys):
    """The clean-mode drafting round (spec §4.2, §4.8, §5.6) for EVERY query position P of every sequence at
    once, unrolled for `steps` draft steps, written with the assistant's own submodules and explicit masks
    (HF's forward takes one query position per row and anchors its sliding mask at the end of the K/V).

    Row P of step s (0-based) is draft step s+1 of a round whose bonus token sits at P:
      input  = pre_projection(concat(emb[P+s], hidden)), hidden = h[P-1] for s = 0, else g of step s-1 at row P
      query position P for every step; K/V of the target positions [0, P) (sliding: the newest n_sliding_keys)
    Returns per step {"g": post_projection output [B,T,H], "logits": dense tied-head logits [B,T,V] (fp32),
    "cent": centroid logits [B,T,C] (fp32) or None, "zf": drafter final-norm output [B,T,h_d]}.
    Rows past the end (P+s >= T) see a zero embedding and must be ignored by the caller."""
    emb, h, kv = feats["emb"], feats["h"], feats["kv"]
    B, T, H = h.shape
    tm = drafter.model
    masks = query_masks(T, n_sliding_keys, h.device)
    pos = torch.arange(T, device=h.device)[None, :]
    hidden = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # row P holds h[P-1]
    rope = {}
    outs = []
    for s in range(steps):
        e = torch.cat([emb[:, s:], emb.new_zeros(B, s, H)], dim=1)  # row P holds emb[P+s]
        u = torch.cat([e, hidden.to(e.dtype)], dim=-1).to(drafter.pre_projection.weight.dtype)  # autocast may lower it
        z = drafter.pre_projection(u)
        for layer in tm.layers:
            attn = layer.self_attn
            lt = attn.layer_type
            res = z
            a = layer.input_layernorm(z)
            q = attn.q_proj(a).view(B, T, -1, attn.head_dim)
            q = attn.q_norm(q)
            key = (lt, q.dtype)
            if key not in rope:
                rope[key] = tm.rotary_emb(q, pos, lt)  # cos, sin [1, T, d] in q.dtype, like HF
            cos, sin = rope[key]
            q = q * cos[:, :, None, :] + rotate_half(q) * sin[:, :, None, :]
            q = q.transpose(1, 2)  # [B, nq, T, d]
            k, v = kv[lt]
            k, v = k.to(q.dtype), v.to(q.dtype)
            rep = q.shape[1] // k.shape[1]
            if rep > 1:  # HF repeat_kv: query head j reads KV head j // rep
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[lt], scale=1.0)
            o = o.transpose(1, 2).reshape(B, T, -1)
            a = layer.post_attention_layernorm(attn.o_proj(o))
            z = res + a
            res = z
            f = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(z)))
            z = (res + f) * layer.layer_scalar
        zf = tm.norm(z)
        g = drafter.post_projection(zf)
        logits = fp32_head(zf, drafter.lm_head.weight)  # dense tied head (training); no soft-cap (spec §4.7)
        me = drafter.masked_embedding
        cent = fp32_head(zf, me.centroids.weight) if me is not None else None
        outs.append({"g": g, "logits": logits, "cent": cent, "zf": zf})
        hidden = g
    return outs


def step_labels(labels, s, ignore=-100):
    """Label of row P at draft step s: the target's greedy token after position P+s; ignore where P = 0 or
    P+s >= T."""
    B, T = labels.shape
    lab = torch.cat([labels[:, s:], labels.new_full((B, s), ignore)], dim=1)
    lab[:, 0] = ignore
    return lab


def masked_argmax(logits, cent, cluster_of, top_k):
    """Greedy token of the centroid-routed head (spec §4.7): argmax over the tokens of the top_k clusters."""
    top = cent.topk(top_k, dim=-1).indices
    sel = torch.zeros(cent.shape, dtype=torch.bool, device=cent.device).scatter_(-1, top, True)
    allowed = sel[..., cluster_of]
    return logits.float().masked_fill(~allowed, float("-inf")).argmax(-1)
