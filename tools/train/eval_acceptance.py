"""Sanity check of the demo pair before tandem measures it (models/README.md): tandem's clean-mode speculative
loop (spec box, §4.8, §5.6) driven through HF's own modules, greedy, K drafts per round, on the held-out
prompts (64 new tokens each) and on a few long held-out prompts (past the sliding window, so the drafter's
sliding mask binds). Simple and exact rather than fast: every round recomputes the target over the whole
accepted sequence without a cache; the drafter runs through Gemma4AssistantForCausalLM.forward (centroid-routed
head, argmax). Prints mean accepted drafts per round and per-position acceptance, and checks that the
speculative output equals plain greedy decoding (a difference is excused only at a near-tie of the top-2
logits). fp32 compute over the bf16 checkpoints, embedding scales rounded to bf16 like HF in bf16 (spec §1.3).
Exit status 1 on a real mismatch.

Usage: python eval_acceptance.py --models STAGE/models/demo --data .cache/train [--k 3] [--json F]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_common as dc  # noqa: E402
from demo_common import log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TIE_GAP = 1e-4


def round_embed_scales(model):
    """fp32 load of a bf16 checkpoint: use bf16(sqrt(H)) as HF does in bf16 (spec §1.3)."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextScaledWordEmbedding
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Gemma4TextScaledWordEmbedding):
                m.embed_scale.copy_(m.embed_scale.to(torch.bfloat16).to(m.embed_scale.dtype))


class Pair:
    def __init__(self, target, drafter):
        self.target, self.drafter = target, drafter
        self.dev = target.device
        self.cap = target.config.final_logit_softcapping
        self.target_passes = 0
        self.drafter_steps = 0

    @torch.no_grad()
    def target_pass(self, ids, want_kv):
        """Full forward over ids: soft-capped logits [T, V] fp32, post-norm hidden [1, T, H], shared K/V."""
        self.target_passes += 1
        x = torch.tensor([ids], dtype=torch.long, device=self.dev)
        out = self.target.model(input_ids=x, use_cache=False, return_shared_kv_states=want_kv)
        h = out.last_hidden_state
        logits = dc.fp32_head(h, self.target.lm_head.weight, self.cap)[0]
        return logits, h, (out.shared_kv_states if want_kv else None)

    @torch.no_grad()
    def draft(self, b, g, kv, P, k):
        """k drafter steps of one round (spec §4.8): query position P held constant, target K/V of [0, P)."""
        kv_p = {t: (kk[:, :, :P], vv[:, :, :P]) for t, (kk, vv) in kv.items()}
        tkn, hid, drafts = b, g, []
        for _ in range(k):
            self.drafter_steps += 1
            e = self.target.model.embed_tokens(torch.tensor([[tkn]], dtype=torch.long, device=self.dev))
            out = self.drafter(
                inputs_embeds=torch.cat([e, hid.to(e.dtype)], dim=-1),
                position_ids=torch.tensor([[P]], dtype=torch.long, device=self.dev),
                attention_mask=torch.ones(1, P + 1, dtype=torch.long, device=self.dev),
                shared_kv_states=kv_p,
            )
            tkn = int(out.logits[0, -1].argmax())
            hid = out.last_hidden_state
            drafts.append(tkn)
        return drafts

    def plain_greedy(self, prompt, n):
        seq, out, gaps = list(prompt), [], []
        for _ in range(n):
            logits, _, _ = self.target_pass(seq, False)
            top2 = torch.topk(logits[-1], 2).values
            t = int(logits[-1].argmax())
            out.append(t)
            gaps.append(float(top2[0] - top2[1]))
            seq.append(t)
        return out, gaps

    def speculative(self, prompt, n, K):
        """Clean mode (spec §5.6). Invariant at the top of a round: seq = tokens of positions [0, P), bonus b at
        P, g = post-norm target hidden of position P-1, kv covers at least [0, P)."""
        seq = list(prompt)
        logits, h, kv = self.target_pass(seq, True)
        P = len(seq)
        b, g = int(logits[P - 1].argmax()), h[:, P - 1:P]
        out, rounds = [b], []
        while len(out) < n:
            k = min(K, n - len(out) - 1)
            drafts = self.draft(b, g, kv, P, k) if k > 0 else []
            logits, h, kv = self.target_pass(seq + [b] + drafts, True)
            s = [int(logits[P + j].argmax()) for j in range(k + 1)]
            m = 0
            while m < k and drafts[m] == s[m]:
                m += 1
            out += drafts[:m] + [s[m]]
            seq = seq + [b] + drafts[:m]
            b, g = s[m], h[:, P + m:P + m + 1]
            P = len(seq)
            if k > 0:
                rounds.append((k, m))
        return out[:n], rounds


def compare(got, want, gaps):
    """None if equal; else (index, near_tie)."""
    diff = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
    if diff is None:
        return None
    return diff, gaps[diff] < TIE_GAP


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", required=True, help="folder with target/ and assistant/")
    ap.add_argument("--data", required=True, help="folder with heldout.txt (long prompts)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--long-prompts", type=int, default=4)
    ap.add_argument("--long-len", type=int, default=180)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

    dev = dc.setup_torch(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tdir, adir = os.path.join(a.models, "target"), os.path.join(a.models, "assistant")
    target = Gemma4ForCausalLM.from_pretrained(tdir, dtype=torch.float32).to(dev).eval()
    drafter = Gemma4AssistantForCausalLM.from_pretrained(adir, dtype=torch.float32).to(dev).eval()
    round_embed_scales(target)
    round_embed_scales(drafter)
    order = drafter.masked_embedding.token_ordering
    assert order.dtype == torch.int64 and torch.equal(torch.sort(order).values, torch.arange(order.numel(), device=order.device))
    tok = dc.load_tokenizer(os.path.join(tdir, "tokenizer.json"))
    pair = Pair(target, drafter)

    prompts = [("short", p, tok.encode(p).ids) for p in dc.read_prompts(os.path.join(HERE, "heldout_prompts.txt"))]
    chapters = dc.read_chapters(os.path.join(a.data, "heldout.txt"))
    for i in range(a.long_prompts):
        ids = tok.encode(chapters[(i * 7 + 3) % len(chapters)]).ids[: a.long_len]
        prompts.append(("long", tok.decode(ids[1:])[:60] + "...", ids))

    try:  # HF's own tokenizer loader should agree with the tokenizers library (not fatal: tandem reads the json)
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(tdir)
        agree = all(hf_tok(p)["input_ids"] == ids for kind, p, ids in prompts if kind == "short")
        log(f"AutoTokenizer ({type(hf_tok).__name__}) {'agrees' if agree else 'DISAGREES'} with tokenizer.json "
            "on the short prompts")
    except Exception as e:  # noqa: BLE001
        log(f"note: AutoTokenizer could not be checked: {type(e).__name__}: {e}")

    clock = dc.Timer()
    totals = {"short": [0, 0], "long": [0, 0]}  # rounds with K drafts, accepted drafts in them
    per_pos = [[0, 0] for _ in range(a.k)]  # [proposed, accepted] at draft position j
    results, failures, near_ties = [], 0, 0
    for kind, text, ids in prompts:
        ref, gaps = pair.plain_greedy(ids, a.new)
        spec, rounds = pair.speculative(ids, a.new, a.k)
        cmp = compare(spec, ref, gaps)
        status = "equal"
        if cmp is not None:
            if cmp[1]:
                status = f"near-tie difference at token {cmp[0]}"
                near_ties += 1
            else:
                status = f"MISMATCH at token {cmp[0]} (top-2 gap {gaps[cmp[0]]:.3g})"
                failures += 1
        full = [m for k, m in rounds if k == a.k]
        totals[kind][0] += len(full)
        totals[kind][1] += sum(full)
        for k, m in rounds:
            for j in range(k):
                per_pos[j][0] += 1
                per_pos[j][1] += int(m > j)
        mean = sum(full) / max(1, len(full))
        results.append({"kind": kind, "prompt": text, "prompt_tokens": len(ids), "rounds": len(rounds),
                        "mean_accepted": round(mean, 3), "status": status,
                        "continuation": tok.decode(ref, skip_special_tokens=False)})
        log(f"[{kind} {len(ids):3d} tok] accepted/round {mean:.2f} over {len(rounds):2d} rounds, {status}: "
            f"{text[:40]!r} -> {tok.decode(ref[:24], skip_special_tokens=False)!r}")

    log("")
    summary = {"k": a.k, "new_tokens": a.new, "seconds": round(clock(), 1), "mismatches": failures,
               "near_ties": near_ties}
    for kind, (n_rounds, acc) in totals.items():
        mean = acc / max(1, n_rounds)
        summary[f"{kind}_rounds"] = n_rounds
        summary[f"{kind}_mean_accepted"] = round(mean, 4)
        log(f"{kind} prompts: mean accepted drafts per K={a.k} round {mean:.3f} (acceptance length {mean + 1:.3f}) "
            f"over {n_rounds} rounds")
    rates = [acc / max(1, prop) for prop, acc in per_pos]
    summary["per_position_acceptance"] = [round(r, 4) for r in rates]
    log(f"per-position acceptance (fraction of rounds that accepted draft j, j = 1..{a.k}): "
        f"{[round(r, 3) for r in rates]}")
    log(f"target passes {pair.target_passes}, drafter steps {pair.drafter_steps}, {clock():.0f} s")
    goal = summary["short_mean_accepted"] >= 1.5
    log(f"goal (short prompts, mean accepted >= 1.5): {'MET' if goal else 'NOT MET'}")
    log(f"speculative == plain greedy: {len(prompts) - failures - near_ties} equal, {near_ties} near-tie, "
        f"{failures} mismatches")
    if a.json:
        dc.save_json(a.json, {"summary": summary, "results": results})
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
