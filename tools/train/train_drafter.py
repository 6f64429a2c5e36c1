"""Trains tandem's demo ASSISTANT drafter (models/README.md): a Gemma4AssistantForCausalLM (model_type
gemma4_assistant; 4 KV-shared layers over the target's K/V, centroid-routed LM head, spec §2.2, §4) for the
frozen demo target, in tandem's clean mode (spec box, §4.2-§4.8, §5.6).

1. token_ordering: balanced k-means (64 clusters x 64 tokens) of the target's tied embedding rows.
2. Self-distillation text: greedy continuations of the target from training-text prefixes (what the drafter
   faces at inference), mixed 1:1 with training-text windows.
3. For each batch: one target forward (no grad) gives the scaled embeddings, the post-norm hiddens, the shared
   K/V and the target's greedy labels; the drafter then runs for EVERY query position P at once, unrolled for
   --k-train steps (demo_common.drafter_unrolled). Loss per step: cross-entropy over the full vocabulary through
   the tied head + cross-entropy of the centroid logits against the label's cluster.
4. Before and after training, drafter_unrolled is checked against HF's own forward (inputs_embeds [1,1,2H],
   position_ids [[P]], mask ones(1, P+1), shared K/V cropped to [0, P)) for several P, below and above the
   sliding window, on g and on the logits of the selected tokens, in fp32. If the sliding-window key count
   disagrees with HF's (spec §8.2), nearby counts are tried and the one HF uses is adopted, loudly.
5. Saves bf16 (token_ordering stays int64) with save_pretrained into OUT/models/demo/assistant and reloads it.

Usage: python train_drafter.py --data .cache/train --out STAGE [--seconds 120] [--metrics F]
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_common as dc  # noqa: E402
from demo_common import BOS_ID, log  # noqa: E402

CHECK_TOL = 2e-3


# ------------------------------------------------------------------------------------- token ordering

def balanced_assign(sim, per_cluster):
    """Greedy balanced assignment: (token, cluster) pairs by decreasing similarity, each cluster takes at most
    per_cluster tokens. sim [V, C]; returns cluster id per token [V]."""
    V, C = sim.shape
    order = torch.argsort(sim.flatten(), descending=True).cpu().tolist()
    cap = [per_cluster] * C
    assign = [-1] * V
    left = V
    for idx in order:
        t, c = divmod(idx, C)
        if assign[t] < 0 and cap[c] > 0:
            assign[t] = c
            cap[c] -= 1
            left -= 1
            if left == 0:
                break
    return torch.tensor(assign, dtype=torch.long, device=sim.device)


def token_ordering(E, n_clusters, iters, seed):
    """Balanced spherical k-means of the embedding rows E [V, D]. Returns (ordering [V] int64: the token ids of
    cluster 0, then cluster 1, ..., ids ascending inside a cluster; cluster_of [V])."""
    V, D = E.shape
    per = V // n_clusters
    X = F.normalize(E.float(), dim=-1)
    g = torch.Generator().manual_seed(seed)
    cent = X[torch.randperm(V, generator=g)[:n_clusters].to(X.device)]
    for _ in range(iters):
        assign = balanced_assign(X @ cent.T, per)
        cent = F.normalize(torch.zeros(n_clusters, D, device=X.device).index_add_(0, assign, X), dim=-1)
    ordering = torch.argsort(assign * V + torch.arange(V, device=X.device))
    counts = torch.bincount(assign, minlength=n_clusters)
    assert int(counts.min()) == int(counts.max()) == per, "clusters are not balanced"
    assert torch.equal(torch.sort(ordering).values, torch.arange(V, device=X.device)), "not a permutation"
    assert torch.equal(assign[ordering].view(n_clusters, per), torch.arange(n_clusters, device=X.device)[:, None].expand(-1, per))
    cohesion = float((X * cent[assign]).sum(-1).mean())
    return ordering, assign, cohesion


# -------------------------------------------------------------------------------- self-distillation text

@torch.no_grad()
def greedy_batch(target, prompts, n_new):
    """Greedy continuations (full recompute each step, fp32 head like target_features' labels)."""
    seq = prompts
    cap = target.config.final_logit_softcapping
    for _ in range(n_new):
        h = target.model(input_ids=seq, use_cache=False).last_hidden_state[:, -1]
        nxt = dc.fp32_head(h, target.lm_head.weight, cap).argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


def make_generated(target, stream, n_seqs, batch, prompt_len, total_len, seconds, gen):
    """[N, total_len] sequences: <bos> + (prompt_len-1) tokens of a random text window + greedy continuation.
    Stops after `seconds` (at least one batch)."""
    clock = dc.Timer()
    out = []
    while sum(o.shape[0] for o in out) < n_seqs and (not out or clock() < seconds):
        x = dc.random_windows(stream, batch, prompt_len - 1, gen)
        x = torch.cat([torch.full_like(x[:, :1], BOS_ID), x], dim=1)
        out.append(greedy_batch(target, x, total_len - prompt_len))
    seqs = torch.cat(out)
    return seqs, clock()


# -------------------------------------------------------------------------------- check against HF

@torch.no_grad()
def hf_reference(drafter, feats, row, positions, steps):
    """HF Gemma4AssistantForCausalLM.forward driven exactly like tandem's clean loop (spec §4.2, §5.6), chained
    with its own g. Returns {(P, s): (g [H], logits [V])} in fp32."""
    ref = {}
    emb, h = feats["emb"][row:row + 1], feats["h"][row:row + 1]
    for P in positions:
        kv = {t: (k[row:row + 1, :, :P], v[row:row + 1, :, :P]) for t, (k, v) in feats["kv"].items()}
        hid = h[:, P - 1:P]
        for s in range(steps):
            inp = torch.cat([emb[:, P + s:P + s + 1], hid], dim=-1)
            out = drafter(
                inputs_embeds=inp,
                position_ids=torch.tensor([[P]], dtype=torch.long, device=inp.device),
                attention_mask=torch.ones(1, P + 1, dtype=torch.long, device=inp.device),
                shared_kv_states=kv,
            )
            ref[(P, s)] = (out.last_hidden_state[0, 0].float(), out.logits[0, 0].float())
            hid = out.last_hidden_state
    return ref


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-6))


@torch.no_grad()
def compare(drafter, feats, rows, positions, steps, n_keys, refs, cluster_of, top_k, expect_sel, verbose):
    """Max relative error of drafter_unrolled vs the HF reference over all (row, P, step), and argmax agreement of
    the centroid-routed head (near-ties excused)."""
    mine = dc.drafter_unrolled(drafter, feats, steps, n_keys)
    worst, bad_argmax = 0.0, 0
    for row in rows:
        for (P, s), (g_hf, lg_hf) in refs[row].items():
            o = mine[s]
            g_me, lg_me = o["g"][row, P].float(), o["logits"][row, P].float()
            sel = lg_hf > lg_hf.min() + 0.5  # HF fills unselected tokens with min(selected) - 1
            n_sel = int(sel.sum())
            assert n_sel == expect_sel, f"HF selected {n_sel} tokens, expected {expect_sel}"
            eg, el = rel_err(g_me, g_hf), rel_err(lg_me[sel], lg_hf[sel])
            am = int(dc.masked_argmax(lg_me, o["cent"][row, P], cluster_of, top_k))
            ah = int(lg_hf.argmax())
            if am != ah:
                top2 = torch.topk(lg_hf[sel], 2).values
                if float(top2[0] - top2[1]) > 1e-3:
                    bad_argmax += 1
            if verbose:
                log(f"    row {row} P {P:3d} step {s + 1}: g rel err {eg:.2e}, logits rel err {el:.2e}, "
                    f"argmax {am} / HF {ah}")
            worst = max(worst, eg, el)
    return worst, bad_argmax


def check_against_hf(drafter, feats32, rows, positions, steps, n_keys, cluster_of, top_k, expect_sel, label):
    """Returns the sliding-window key count that reproduces HF (n_keys first); raises if none does."""
    was_training = drafter.training
    drafter.eval()
    refs = {row: hf_reference(drafter, feats32, row, positions, steps) for row in rows}
    log(f"  [{label}] HF forward vs batched forward, fp32, P in {positions}, {steps} steps, rows {rows}, "
        f"{n_keys} sliding keys:")
    worst, bad = compare(drafter, feats32, rows, positions, steps, n_keys, refs, cluster_of, top_k, expect_sel, True)
    chosen = n_keys
    if worst > CHECK_TOL or bad:
        log(f"  MISMATCH with {n_keys} sliding keys (worst rel err {worst:.2e}, {bad} argmax differences)")
        chosen = None
        for alt in (n_keys - 1, n_keys + 1, n_keys - 2, n_keys + 2):
            w2, b2 = compare(drafter, feats32, rows, positions, steps, alt, refs, cluster_of, top_k, expect_sel, False)
            log(f"    {alt} sliding keys: worst rel err {w2:.2e}, {b2} argmax differences")
            if w2 <= CHECK_TOL and not b2:
                chosen, worst = alt, w2
                break
        if chosen is None:
            raise AssertionError("the batched drafter forward does not reproduce HF's; see the errors above")
        log(f"  WARNING: HF's drafter sees the newest {chosen} sliding keys, not {n_keys}; training with {chosen}")
    log(f"  [{label}] batched forward == HF forward (worst rel err {worst:.2e} <= {CHECK_TOL})")
    drafter.train(was_training)
    return chosen


# --------------------------------------------------------------------------------------- train / eval

def step_losses(outs, labels, cluster_of, cluster_weight):
    total, parts = 0.0, []
    V = outs[0]["logits"].shape[-1]
    C = outs[0]["cent"].shape[-1]
    for s, o in enumerate(outs):
        lab = dc.step_labels(labels, s)
        ce = F.cross_entropy(o["logits"].float().reshape(-1, V), lab.reshape(-1), ignore_index=-100)
        clab = torch.where(lab >= 0, cluster_of[lab.clamp(min=0)], torch.full_like(lab, -100))
        cce = F.cross_entropy(o["cent"].float().reshape(-1, C), clab.reshape(-1), ignore_index=-100)
        total = total + (ce + cluster_weight * cce) / len(outs)
        parts.append((float(ce), float(cce)))
    return total, parts


@torch.no_grad()
def evaluate(drafter, target, x, first_row, k_eval, n_keys, cluster_of, top_k):
    """Per-step accuracy of the centroid-routed greedy draft vs the target's greedy token, and the mean number of
    leading correct drafts of a K=k_eval round at every P >= first_row (for greedy self-generated text this is
    the clean-mode accepted count per round that tandem measures)."""
    feats = dc.target_features(target, x)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
        outs = dc.drafter_unrolled(drafter, feats, k_eval, n_keys)
    T = x.shape[1]
    accs, correct = [], []
    for s, o in enumerate(outs):
        lab = dc.step_labels(feats["labels"], s)
        pred = dc.masked_argmax(o["logits"], o["cent"], cluster_of, top_k)
        ok = (pred == lab) & (lab >= 0)
        accs.append(float(ok.sum() / (lab >= 0).sum()))
        correct.append(ok[:, first_row:T - k_eval + 1])
    lead = torch.cumprod(torch.stack(correct, -1).int(), dim=-1).sum(-1).float()
    return accs, float(lead.mean())


def check_structure(drafter, target):
    pubs = dc.publisher_layers(target.model)
    d = dc.DRAFTER
    assert len(drafter.model.layers) == len(d["layer_types"])
    for i, layer in enumerate(drafter.model.layers):
        a = layer.self_attn
        src = target.model.layers[pubs[a.layer_type]].self_attn
        assert a.layer_type == d["layer_types"][i]
        assert a.is_kv_shared_layer and not hasattr(a, "k_proj"), f"drafter layer {i} is not KV-shared"
        assert a.head_dim == src.head_dim, f"drafter layer {i}: head_dim {a.head_dim} vs target {src.head_dim}"
        assert d["heads"] // a.num_key_value_groups == target.config.num_attention_heads // src.num_key_value_groups
        assert layer.mlp.intermediate_size == d["d_ff"]
    H = target.config.hidden_size
    assert tuple(drafter.pre_projection.weight.shape) == (d["hidden"], 2 * H)
    assert tuple(drafter.post_projection.weight.shape) == (H, d["hidden"])
    assert drafter.lm_head.weight.data_ptr() == drafter.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    me = drafter.masked_embedding
    assert me is not None and tuple(me.centroids.weight.shape) == (d["num_centroids"], d["hidden"])
    assert drafter.config.get_text_config().sliding_window == target.config.sliding_window
    log(f"  structure OK: 4 KV-shared layers reading target layers {pubs}, head dims "
        f"{[l.self_attn.head_dim for l in drafter.model.layers]}, centroids {d['num_centroids']} x "
        f"{dc.VOCAB // d['num_centroids']}, top-k {d['centroid_top_k']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="stage folder holding models/demo/target")
    ap.add_argument("--seconds", type=float, default=120.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--gen-seconds", type=float, default=30.0)
    ap.add_argument("--gen-seqs", type=int, default=2048)
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--held-seqs", type=int, default=128, help="held-out generated sequences (and /2 text windows)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--batch-data", type=int, default=32)
    ap.add_argument("--batch-gen", type=int, default=32)
    ap.add_argument("--k-train", type=int, default=4)
    ap.add_argument("--k-eval", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--cluster-weight", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--metrics", default=None)
    a = ap.parse_args()

    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

    dev = dc.setup_torch(a.seed)
    if dev.type != "cuda":
        log("WARNING: no GPU; running on the CPU (only useful for testing the script)")
    target_dir = os.path.join(a.out, "models", "demo", "target")
    target = Gemma4ForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to(dev).eval()
    target.requires_grad_(False)
    tok = dc.load_tokenizer(os.path.join(target_dir, "tokenizer.json"))
    train = dc.encode_stream(tok, os.path.join(a.data, "kjv.txt")).to(dev)
    held = dc.encode_stream(tok, os.path.join(a.data, "heldout.txt")).to(dev)
    W = target.config.sliding_window
    log(f"target {target_dir}: window {W}, shared K/V from layers {dc.publisher_layers(target.model)}")
    probe = held[None, : a.seq]
    f = dc.target_features(target, probe)
    log(f"  shared K/V shapes {[(t, tuple(f['kv'][t][0].shape)) for t in sorted(f['kv'])]}")
    try:  # the post-norm hidden and shared K/V that HF's own candidate generator reads (spec §4.3)
        with torch.no_grad():
            out = target(input_ids=probe, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
        same_h = torch.equal(out.hidden_states[-1], f["h"])
        same_kv = all(torch.equal(out.shared_kv_states[t][i], f["kv"][t][i]) for t in f["kv"] for i in (0, 1))
        log(f"  hidden_states[-1] == last_hidden_state (post-norm): {same_h}; shared K/V equal: {same_kv}")
        if not (same_h and same_kv):
            log("  WARNING: HF's generator would feed the drafter something else than target_features (spec §4.3)")
    except Exception as e:  # noqa: BLE001 - informative only
        log(f"  WARNING: could not compare with output_hidden_states: {type(e).__name__}: {e}")
    gen = torch.Generator().manual_seed(a.seed)

    # 1. token ordering from the target's tied embeddings
    d = dc.DRAFTER
    ordering, cluster_of, cohesion = token_ordering(target.model.embed_tokens.weight, d["num_centroids"], 8, a.seed)
    log(f"token_ordering: {d['num_centroids']} balanced clusters, mean cosine to centroid {cohesion:.3f}")
    for c in range(3):
        toks = [tok.id_to_token(int(t)) for t in ordering.view(d["num_centroids"], -1)[c][:12]]
        log(f"  cluster {c}: {toks}")

    # 2. self-distillation text
    gen_train, secs = make_generated(target, train, a.gen_seqs, a.gen_batch, a.prompt_len, a.seq, a.gen_seconds, gen)
    gen_held, _ = make_generated(target, held, a.held_seqs, a.held_seqs, a.prompt_len, a.seq, 0.0, gen)
    log(f"generated {gen_train.shape[0]} training and {gen_held.shape[0]} held-out sequences of {a.seq} tokens "
        f"({a.seq - a.prompt_len} greedy tokens each) in {secs:.0f} s")
    log(f"  sample: {tok.decode(gen_held[0, a.prompt_len:a.prompt_len + 48].tolist())!r}")

    # 3. drafter
    cfg = dc.drafter_config(target)
    drafter = Gemma4AssistantForCausalLM(cfg)
    dc.ensure_tied(drafter)
    check_structure(drafter, target)
    with torch.no_grad():
        drafter.masked_embedding.token_ordering.copy_(ordering.cpu())
    n_params = dc.count_params(drafter)
    size = dc.saved_bytes(drafter)
    log(f"drafter: {n_params:,} parameters, {size:,} bytes in bf16 (budget {dc.DRAFTER_MAX_BYTES:,})")
    assert size <= dc.DRAFTER_MAX_BYTES, "drafter over its size budget"
    scalars = dc.layer_scalars_to_params(drafter)
    drafter.to(dev).train()
    top_k = d["centroid_top_k"]
    expect_sel = top_k * (dc.VOCAB // d["num_centroids"])

    # 4. the batched forward must be HF's forward (before training, random weights)
    check_x = torch.stack([held[1000:1000 + a.seq], gen_held[0]])
    check_feats = dc.features_to(dc.target_features(target, check_x), torch.float32)
    positions = [1, 2, 17, 64, W - 1, W, W + 1, W + 2, W + 3, 200, a.seq - a.k_train]
    n_keys = check_against_hf(drafter, check_feats, [0, 1], positions, a.k_train, W + 1, cluster_of, top_k,
                              expect_sel, "before training")

    # 5. training
    opt = dc.make_adamw(dc.param_groups(drafter, a.lr, a.wd))
    warmup = 100
    log(f"training: {a.batch_data} text + {a.batch_gen} generated sequences x {a.seq} per step, {a.k_train} "
        f"unrolled steps, up to {a.max_steps} steps or {a.seconds:.0f} s, lr {a.lr}, wd {a.wd}, "
        f"cluster loss weight {a.cluster_weight}, {n_keys} sliding keys")
    held_text = dc.random_windows(held, max(1, a.held_seqs // 2), a.seq, torch.Generator().manual_seed(7))
    clock = dc.Timer()
    step, history = 0, []
    while True:
        progress = max(step / a.max_steps, clock() / a.seconds)
        if progress >= 1.0:
            break
        lr = dc.schedule(opt, step, progress, warmup)
        xd = dc.random_windows(train, a.batch_data, a.seq, gen)
        xg = gen_train[torch.randint(0, gen_train.shape[0], (a.batch_gen,), generator=gen).to(dev)]
        x = torch.cat([xd, xg])
        feats = dc.target_features(target, x)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            outs = dc.drafter_unrolled(drafter, feats, a.k_train, n_keys)
        loss, parts = step_losses(outs, feats["labels"], cluster_of, a.cluster_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        assert math.isfinite(float(loss)), f"loss is {float(loss)} at step {step}"
        if step % 50 == 0 or step == 1:
            ce = " ".join(f"{p[0]:.3f}/{p[1]:.3f}" for p in parts)
            log(f"step {step:5d}  loss {float(loss):.4f}  token/cluster CE per step {ce}  lr {lr:.2e}  "
                f"|g| {float(gnorm):.2f}  {clock():.0f} s")
        if step % a.eval_every == 0:
            acc_g, lead_g = evaluate(drafter, target, gen_held, a.prompt_len, a.k_eval, n_keys, cluster_of, top_k)
            acc_t, lead_t = evaluate(drafter, target, held_text, 1, a.k_eval, n_keys, cluster_of, top_k)
            history.append({"step": step, "gen_acc": acc_g, "gen_accepted": lead_g, "text_acc": acc_t,
                             "text_accepted": lead_t})
            log(f"  held-out: generated text acc/step {[round(v, 3) for v in acc_g]}, accepted per K={a.k_eval} "
                f"round {lead_g:.3f}; KJV text acc/step {[round(v, 3) for v in acc_t]}, accepted {lead_t:.3f}")

    acc_g, lead_g = evaluate(drafter, target, gen_held, a.prompt_len, a.k_eval, n_keys, cluster_of, top_k)
    acc_t, lead_t = evaluate(drafter, target, held_text, 1, a.k_eval, n_keys, cluster_of, top_k)
    log(f"finished: {step} steps in {clock():.0f} s")
    log(f"  held-out generated text: acc/step {[round(v, 3) for v in acc_g]}, mean accepted drafts per K={a.k_eval} "
        f"round {lead_g:.3f} (acceptance length {lead_g + 1:.3f})")
    log(f"  held-out KJV text:       acc/step {[round(v, 3) for v in acc_t]}, mean accepted {lead_t:.3f}")
    log(f"layer scalars: {[round(float(p), 4) for p in scalars]}")

    check_against_hf(drafter, check_feats, [0, 1], positions, a.k_train, n_keys, cluster_of, top_k, expect_sel,
                     "after training")
    if n_keys != W + 1:
        log(f"WARNING: HF's drafter used {n_keys} sliding keys, not W+1 = {W + 1}: the drafter was trained to match "
            "HF, but spec §4.6 and tandem's clean-mode window must be re-checked")

    # 6. save bf16 in the HF layout
    dc.layer_scalars_to_buffers(drafter)
    drafter.eval()
    drafter.to(torch.bfloat16)
    assert drafter.masked_embedding.token_ordering.dtype == torch.int64
    out_dir = os.path.join(a.out, "models", "demo", "assistant")
    os.makedirs(out_dir, exist_ok=True)
    drafter.save_pretrained(out_dir)
    dc.write_generation_config(out_dir, {"num_assistant_tokens": a.k_eval, "num_assistant_tokens_schedule": "constant"})
    dc.copy_tokenizer(target_dir, out_dir)
    log(f"saved {out_dir}: {sorted(os.listdir(out_dir))}, {dc.folder_bytes(out_dir):,} bytes")

    reloaded = Gemma4AssistantForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16).to(dev).eval()
    sd_a, sd_b = drafter.state_dict(), reloaded.state_dict()
    assert set(sd_a) == set(sd_b), f"state dict keys differ: {set(sd_a) ^ set(sd_b)}"
    for k in sd_a:
        assert torch.equal(sd_a[k].to(dev), sd_b[k]), f"{k} differs after reload"
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        order_t = f.get_tensor("masked_embedding.token_ordering")
    assert order_t.dtype == torch.int64 and torch.equal(order_t, ordering.cpu()), "token_ordering not saved as int64"
    assert "lm_head.weight" not in keys and not any("k_proj" in k or "v_proj" in k for k in keys), keys
    log(f"reloaded: {len(keys)} tensors, token_ordering int64; keys: {sorted(keys)[:6]} ...")

    if a.metrics:
        dc.save_json(a.metrics, {
            "params": n_params, "bytes_bf16": size, "files_bytes": dc.folder_bytes(out_dir), "steps": step,
            "seconds": round(clock(), 1), "generated_sequences": int(gen_train.shape[0]),
            "sliding_keys": n_keys, "cluster_cohesion": round(cohesion, 4),
            "heldout_generated_acc_per_step": acc_g, "heldout_generated_accepted_k3": round(lead_g, 4),
            "heldout_text_acc_per_step": acc_t, "heldout_text_accepted_k3": round(lead_t, 4),
            "history": history,
        })
    log("drafter OK")


if __name__ == "__main__":
    main()
