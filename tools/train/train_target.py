"""Trains tandem's demo TARGET (models/README.md): a small E-style Gemma4ForCausalLM (model_type gemma4_text;
per-layer embeddings, the last two layers KV-shared with double-wide MLPs, like E2B; spec §1, §2.1) built from
transformers' own Gemma 4 classes, on the KJV training text with the demo tokenizer. AdamW, bf16 autocast over
fp32 master weights, packed random windows, warmup + cosine; the checkpoint with the best held-out loss is kept.
Saves bf16 with save_pretrained (+ generation_config.json and the tokenizer files) into OUT/models/demo/target,
reloads it and checks it, and prints greedy samples for held-out prompts.

Usage: python train_target.py --data .cache/train --tokenizer DIR --out STAGE [--seconds 150] [--metrics F]
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_common as dc  # noqa: E402
from demo_common import FULL, SLIDING, log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def check_structure(model):
    """The HF modules resolve the config as intended (head dims, KV sharing, publishers, MLP widths, PLE)."""
    t = dc.TARGET
    first_shared = len(t["layer_types"]) - t["kv_shared"]
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        lt = t["layer_types"][i]
        want_d = t["head_dim"] if lt == SLIDING else t["global_head_dim"]
        assert a.layer_type == lt, (i, a.layer_type)
        assert a.head_dim == want_d, f"layer {i}: head_dim {a.head_dim}, expected {want_d}"
        assert t["heads"] // a.num_key_value_groups == t["kv_heads"], f"layer {i}: kv groups {a.num_key_value_groups}"
        assert bool(a.is_kv_shared_layer) == (i >= first_shared), f"layer {i}: is_kv_shared_layer"
        want_ff = t["d_ff"] * (2 if i >= first_shared else 1)
        assert layer.mlp.intermediate_size == want_ff, f"layer {i}: MLP {layer.mlp.intermediate_size} != {want_ff}"
        assert layer.hidden_size_per_layer_input == t["ple_dim"]
        assert (not hasattr(a, "k_proj")) == (i >= first_shared), f"layer {i}: k_proj presence"
    pubs = dc.publisher_layers(model.model)
    assert pubs == {SLIDING: 5, FULL: 3}, f"shared K/V publishers {pubs}"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    log(f"  structure OK: head dims {t['head_dim']}/{t['global_head_dim']}, KV-shared layers >= {first_shared}, "
        f"shared K/V from layers {pubs}, MLP {t['d_ff']} / {2 * t['d_ff']} (shared layers), PLE {t['ple_dim']}")


def logits_of(model, x):
    """Soft-capped logits in fp32 from the post-norm hidden (same math as Gemma4ForCausalLM.forward, §1.11)."""
    h = model.model(input_ids=x, use_cache=False).last_hidden_state
    return dc.fp32_head(h, model.lm_head.weight, model.config.final_logit_softcapping)


@torch.no_grad()
def heldout_loss(model, windows, batch=32, autocast=True):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch]
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast and x.is_cuda):
            lg = logits_of(model, x)
        loss = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(loss)
        n += x[:, 1:].numel()
    model.train()
    return tot / n


@torch.no_grad()
def greedy(model, ids, n_new):
    """Greedy continuation, full recompute every step (ignores <eos>)."""
    seq = torch.tensor([ids], device=model.device)
    for _ in range(n_new):
        nxt = model(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[0, len(ids):].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True, help="stage folder; the model goes to OUT/models/demo/target")
    ap.add_argument("--seconds", type=float, default=150.0, help="training time budget")
    ap.add_argument("--epochs", type=float, default=20.0, help="step budget in passes over the training text")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--metrics", default=None)
    a = ap.parse_args()

    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    dev = dc.setup_torch(a.seed)
    if dev.type != "cuda":
        log("WARNING: no GPU; running on the CPU (only useful for testing the script)")
    tok = dc.load_tokenizer(os.path.join(a.tokenizer, "tokenizer.json"))
    train = dc.encode_stream(tok, os.path.join(a.data, "kjv.txt")).to(dev)
    held = dc.encode_stream(tok, os.path.join(a.data, "heldout.txt")).to(dev)
    n_held = held.numel() // a.seq
    held_windows = held[: n_held * a.seq].view(n_held, a.seq)
    log(f"data: {train.numel()} training tokens, {held.numel()} held-out tokens ({n_held} windows of {a.seq})")

    cfg = dc.target_config()
    model = Gemma4ForCausalLM(cfg)
    dc.ensure_tied(model)
    log(f"config: {type(cfg).__name__}, attn_implementation {getattr(model.config, '_attn_implementation', None)}")
    check_structure(model)
    n_params = dc.count_params(model)
    size = dc.saved_bytes(model)
    log(f"target: {n_params:,} parameters, {size:,} bytes in bf16 (budget {dc.TARGET_MAX_BYTES:,})")
    assert size <= dc.TARGET_MAX_BYTES, "target over its size budget"

    scalars = dc.layer_scalars_to_params(model)
    model.to(dev).train()
    opt = dc.make_adamw(dc.param_groups(model, a.lr, a.wd))
    tokens_per_step = a.batch * a.seq
    max_steps = max(1, int(a.epochs * train.numel() / tokens_per_step))
    warmup = max(1, min(200, max_steps // 20))
    log(f"training: batch {a.batch} x {a.seq} = {tokens_per_step} tokens/step, up to {max_steps} steps "
        f"({a.epochs} epochs) or {a.seconds:.0f} s, lr {a.lr} (warmup {warmup}), wd {a.wd}")

    gen = torch.Generator().manual_seed(a.seed)
    clock = dc.Timer()
    best = (float("inf"), -1, None)
    history = []
    step, loss_avg = 0, None
    while True:
        progress = max(step / max_steps, clock() / a.seconds)
        if progress >= 1.0:
            break
        lr = dc.schedule(opt, step, progress, warmup)
        x = dc.random_windows(train, a.batch, a.seq, gen)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            lg = logits_of(model, x)
        loss = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = float(loss)
        assert math.isfinite(lv), f"loss is {lv} at step {step}"
        loss_avg = lv if loss_avg is None else 0.98 * loss_avg + 0.02 * lv
        if step % 50 == 0 or step == 1:
            tps = step * tokens_per_step / clock()
            log(f"step {step:5d}  loss {lv:.4f} (avg {loss_avg:.4f})  lr {lr:.2e}  |g| {float(gnorm):.2f}  "
                f"{tps / 1e3:.0f}k tok/s  {clock():.0f} s")
        if step % a.eval_every == 0:
            hl = heldout_loss(model, held_windows)
            history.append((step, round(loss_avg, 4), round(hl, 4)))
            mark = ""
            if hl < best[0]:
                best = (hl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = "  (best)"
            log(f"  held-out loss {hl:.4f} (ppl {math.exp(hl):.1f}) at step {step}{mark}")

    hl = heldout_loss(model, held_windows)
    history.append((step, round(loss_avg, 4), round(hl, 4)))
    log(f"finished: {step} steps, {step * tokens_per_step / train.numel():.1f} epochs in {clock():.0f} s; "
        f"final held-out loss {hl:.4f}")
    if hl < best[0]:
        best = (hl, step, None)
    elif best[2] is not None:
        model.load_state_dict(best[2])
        log(f"restored the best checkpoint (step {best[1]}, held-out loss {best[0]:.4f})")
    best_loss, best_step = best[0], best[1]
    log(f"layer scalars: {[round(float(p), 4) for p in scalars]}")

    # bf16, HF layout; layer_scalar back to a buffer under its own name.
    dc.layer_scalars_to_buffers(model)
    model.eval()
    out_dir = os.path.join(a.out, "models", "demo", "target")
    os.makedirs(out_dir, exist_ok=True)
    model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    dc.write_generation_config(out_dir)
    dc.copy_tokenizer(a.tokenizer, out_dir)
    log(f"saved {out_dir}: {sorted(os.listdir(out_dir))}, {dc.folder_bytes(out_dir):,} bytes")

    reloaded = Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16).to(dev).eval()
    sd_a, sd_b = model.state_dict(), reloaded.state_dict()
    assert set(sd_a) == set(sd_b), f"state dict keys differ: {set(sd_a) ^ set(sd_b)}"
    for k in sd_a:
        assert torch.equal(sd_a[k].to(dev), sd_b[k]), f"{k} differs after reload"
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert "lm_head.weight" not in keys and "model.layers.0.layer_scalar" in keys, "unexpected tensor names"
    assert not any(f"layers.{i}.self_attn.k_proj" in k for k in keys for i in (6, 7)), "shared layers hold k_proj"
    bf16_loss = heldout_loss(reloaded, held_windows, autocast=False)
    log(f"reloaded bf16 checkpoint: {len(keys)} tensors, held-out loss {bf16_loss:.4f} (ppl {math.exp(bf16_loss):.1f})")
    assert bf16_loss < best_loss + 0.1, "the bf16 checkpoint is much worse than the trained model"

    samples = []
    for p in dc.read_prompts(os.path.join(HERE, "heldout_prompts.txt"))[:6]:
        ids = tok.encode(p).ids
        cont = greedy(reloaded, ids, 40)
        text = tok.decode(cont, skip_special_tokens=False)
        samples.append({"prompt": p, "continuation": text})
        log(f"  [{p}] -> {text!r}")

    if a.metrics:
        dc.save_json(a.metrics, {
            "params": n_params, "bytes_bf16": size, "files_bytes": dc.folder_bytes(out_dir),
            "train_tokens": train.numel(), "heldout_tokens": held.numel(), "steps": step,
            "tokens_per_step": tokens_per_step, "epochs": round(step * tokens_per_step / train.numel(), 2),
            "seconds": round(clock(), 1), "best_step": best_step, "best_heldout_loss": round(best_loss, 4),
            "bf16_heldout_loss": round(bf16_loss, 4), "history": history, "samples": samples,
            "layer_scalars": [float(reloaded.model.layers[i].layer_scalar) for i in range(len(reloaded.model.layers))],
        })
    log("target OK")


if __name__ == "__main__":
    main()
