#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Training a small transformer with context parallelism from PyTorch.

The Python twin of examples/train/train.c: a decoder-only transformer
(embedding, RMSNorm, grouped-query attention with rotary embeddings on
global positions, MLP, LM head, AdamW) trained on a synthetic corpus, once
on a single device in plain PyTorch (the reference) and then under CP = 2
and 4 in every CP mode and layout through ``infinicp.torch``, with ranks
as threads of this process on the CPU (the library's in-process
transport). Every CP run must reproduce the reference's per-step losses;
the program exits with status 1 if one does not.

What a trainer does to adopt CP (look for "CP step"):
  1. make a context, a CP group and an attention plan per rank;
  2. shard every batch: token ids AND labels (shifted on the GLOBAL
     sequence first), and take each local token's global position (for
     packed rows: its position inside its document) for the rotary
     embedding;
  3. run attention through infinicp.torch.attention (autograd does the
     backward through the library);
  4. reduce the loss: the sum of the ranks' loss sums over the global
     token count (Comm.loss_reduce), and start the backward from the local
     loss sum divided by that global count;
  5. sum the gradients of the (replicated) parameters over the CP ranks
     (Comm.grad_all_reduce) before the optimizer step.
Everything else is single-device PyTorch code.

Usage: python3 examples/python/train.py [--steps N] [--quick] [--verbose]
Needs PyTorch (CPU is enough), NumPy and the infinicp package
(PYTHONPATH=python and INFINICP_LIBRARY=build/lib/libinfinicp.so.1 in the
source tree).
"""

import argparse
import copy
import sys

import torch
import torch.nn.functional as F

import infinicp
import infinicp.torch as icpt

VOCAB, DIM, HEADS, KV_HEADS, LAYERS, MLP = 64, 32, 4, 2, 2, 64
HEAD_DIM = DIM // HEADS


# ---- the model: single-device code; attention is a function passed in ------


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, positions):
    """Rotary embedding of x [B, T, H, D] at positions [B, T] (global ones
    under CP: the rotation depends on where a token is in the sequence)."""
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    angle = positions[..., None].float() * freq  # [B, T, half]
    cos, sin = angle.cos()[:, :, None, :], angle.sin()[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(DIM), RMSNorm(DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.wk = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.up = torch.nn.Linear(DIM, MLP, bias=False)
        self.down = torch.nn.Linear(MLP, DIM, bias=False)

    def forward(self, x, positions, attn):
        B, T, _ = x.shape
        h = self.norm1(x)
        q = rope(self.wq(h).view(B, T, HEADS, HEAD_DIM), positions)
        k = rope(self.wk(h).view(B, T, KV_HEADS, HEAD_DIM), positions)
        v = self.wv(h).view(B, T, KV_HEADS, HEAD_DIM)
        x = x + self.wo(attn(q, k, v).reshape(B, T, HEADS * HEAD_DIM))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, positions, attn):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, positions, attn)
        return self.head(self.norm(x))


def reference_attention(doc_ids):
    """Causal attention over the whole sequence in plain PyTorch (the
    single-device run), never across documents."""
    def attn(q, k, v):
        S = q.shape[1]
        grp = HEADS // KV_HEADS
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k.repeat_interleave(grp, 2), v.repeat_interleave(grp, 2)))
        i = torch.arange(S)
        mask = (i[None, :] <= i[:, None]) & (doc_ids[:, None] == doc_ids[None, :])
        s = (qh @ kh.transpose(-1, -2)) * HEAD_DIM ** -0.5
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        return (p @ vh).transpose(1, 2)
    return attn


# ---- data --------------------------------------------------------------------


def batches(steps, batch, seq, packed, seed=1):
    """A synthetic corpus with structure to learn: t[i+1] = (5 t[i] + 3) %
    VOCAB, with one token in ten replaced by a random one. Yields (tokens
    [B, S+1], cu_seqlens or None); a packed row holds four documents."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            t = [int(torch.randint(0, VOCAB, (1,), generator=g))]
            for _ in range(seq):
                nxt = (5 * t[-1] + 3) % VOCAB
                if float(torch.rand(1, generator=g)) < 0.1:
                    nxt = int(torch.randint(0, VOCAB, (1,), generator=g))
                t.append(nxt)
            rows.append(t)
        cu = None
        if packed:  # documents of random lengths in one row
            cuts = sorted(set(int(x) for x in torch.randint(1, seq, (3,), generator=g)))
            cu = [0] + cuts + [seq]
        yield torch.tensor(rows), cu


def doc_ids_of(cu, seq):
    ids = torch.zeros(seq, dtype=torch.long)
    for d in range(len(cu) - 1):
        ids[cu[d]:cu[d + 1]] = d
    return ids


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


# ---- the single-device reference ---------------------------------------------


def train_reference(init, data):
    model = copy.deepcopy(init)
    opt = make_optimizer(model)
    losses = []
    for tokens, cu in data:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        S = inputs.shape[1]
        if cu is None:
            doc_ids, positions = torch.zeros(S, dtype=torch.long), torch.arange(S)
        else:
            doc_ids = doc_ids_of(cu, S)
            positions = torch.arange(S) - torch.tensor(cu)[doc_ids]  # position inside the document
        logits = model(inputs, positions.expand(inputs.shape[0], S), reference_attention(doc_ids))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---- the CP run ----------------------------------------------------------------


def train_cp(init, data, cp, mode, layout):
    """Train the same model on cp in-process ranks; returns rank 0's losses."""
    data = list(data)
    batch, seq = data[0][0].shape[0], data[0][0].shape[1] - 1

    def rank_main(rank, comm):
        torch.set_num_threads(1)
        model = copy.deepcopy(init)  # every rank holds the whole model (CP splits tokens only)
        opt = make_optimizer(model)
        params = [p for p in model.parameters()]
        losses = []
        # CP step 1: a context, a group, a plan
        with infinicp.Context("cpu", num_threads=1) as ctx, \
                infinicp.Group(ctx, comm, a2a_size=2 if mode == "a2a_p2p" else 1) as group, \
                infinicp.AttnPlan(group, "float32", batch, seq, HEADS, KV_HEADS, HEAD_DIM, causal=True,
                                  layout=layout, mode=mode) as plan:
            for tokens, cu in data:
                # CP step 2: shift labels globally, then shard tokens, labels and positions
                inputs, labels = tokens[:, :-1], tokens[:, 1:]
                pack = None
                if layout == "packed":
                    pack = infinicp.Pack(cp, cu)  # every rank makes the same one
                    where = pack
                    positions = torch.as_tensor(pack.doc_positions(rank))
                else:
                    where = plan
                    positions = torch.as_tensor(infinicp.layout_positions(layout, cp, rank, seq))
                inputs_l = icpt.shard(inputs, where, rank, dim=1)
                labels_l = icpt.shard(labels, where, rank, dim=1)
                positions = positions.expand(batch, -1)

                # CP step 3: attention through the library, the rest unchanged
                def attn(q, k, v):
                    return icpt.attention(q, k, v, plan, pack=pack)

                logits = model(inputs_l, positions, attn)
                loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), labels_l.reshape(-1), reduction="sum")

                # CP step 4: the global mean loss; the backward from loss_sum / global count
                mean, total = comm.loss_reduce(loss_sum.item(), labels_l.numel())
                opt.zero_grad()
                (loss_sum / total).backward()

                # CP step 5: sum the replicated parameters' gradients over the CP ranks
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                comm.grad_all_reduce(flat.numpy())  # in place, through a NumPy view
                off = 0
                for p in params:
                    n = p.numel()
                    p.grad.copy_(flat[off:off + n].view_as(p))
                    off += n
                opt.step()
                losses.append(mean)
                if pack is not None:
                    pack.close()
        return losses

    return infinicp.run_ranks(cp, rank_main)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="CP = 2 only, p2p and a2a")
    ap.add_argument("--tolerance", type=float, default=2e-4, help="largest relative loss difference")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    init = Model()
    batch, seq = 2, 32

    ok = True
    for layout in ("contiguous", "zigzag", "packed"):
        b = 1 if layout == "packed" else batch
        data = list(batches(args.steps, b, seq, layout == "packed"))
        ref = train_reference(init, data)
        print("%-10s reference losses: %s" % (layout, " ".join("%.4f" % x for x in ref)))
        for cp in ((2,) if args.quick else (2, 4)):
            for mode in (("p2p", "a2a") if args.quick else ("all_gather", "p2p", "a2a", "a2a_p2p")):
                if mode == "a2a_p2p" and cp < 4:
                    continue
                got = train_cp(init, data, cp, mode, layout)
                worst = max(abs(g - r) / max(1.0, abs(r)) for g, r in zip(got, ref))
                good = worst <= args.tolerance
                ok &= good
                print("%-10s CP=%d %-10s largest relative difference %.2e %s" % (
                    layout, cp, mode, worst, "ok" if good else "MISMATCH"))
                if args.verbose or not good:
                    print("    losses: %s" % " ".join("%.4f" % x for x in got))
        if sum(ref[-2:]) >= sum(ref[:2]):
            print("the reference did not learn: loss %.4f -> %.4f" % (ref[0], ref[-1]))
            ok = False
    print("every CP run reproduces the single-device losses" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
