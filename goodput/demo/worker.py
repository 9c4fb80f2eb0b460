"""One rank of the demo's training job: ``python -m goodput.demo.worker ...`` (see goodput.demo).

A small GPT-style model trained data-parallel on the CPU (gloo). Every step's global batch is
the same 8 samples whatever the world size: with 2 ranks each takes 4 and gradients are summed by
all-reduce; with 1 rank it computes both halves and sums them in the same order, so the update
arithmetic is the same and the loss trajectory can be compared bitwise across world sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 64, 4, 2, 32
GLOBAL_BATCH, HALVES = 8, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def samples(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample i of the stream, the same in every process: a noisy affine token sequence."""
    xs = []
    for i in range(start, start + n):
        g = torch.Generator().manual_seed(i)
        a, c = int(torch.randint(1, VOCAB, (1,), generator=g)), int(torch.randint(0, VOCAB, (1,), generator=g))
        t = [int(torch.randint(0, VOCAB, (1,), generator=g))]
        for _ in range(SEQ):
            t.append(
                (t[-1] * a + c) % VOCAB
                if torch.rand(1, generator=g) > 0.1
                else int(torch.randint(0, VOCAB, (1,), generator=g))
            )
        xs.append(t)
    x = torch.tensor(xs)
    return x[:, :-1], x[:, 1:]


def half_loss(model: nn.Module, step: int, half: int) -> torch.Tensor:
    per = GLOBAL_BATCH // HALVES
    x, y = samples(step * GLOBAL_BATCH + half * per, per)
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, world: int) -> float:
    opt.zero_grad(set_to_none=True)
    if world == HALVES:
        loss = half_loss(model, step, rank)
        loss.backward()
        flat = [p.grad for p in model.parameters()]
        for g in flat:
            dist.all_reduce(g)  # g0 + g1
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        total = lt
    else:  # one rank does both halves and sums them as the all-reduce would
        grads, total = None, None
        for h in range(HALVES):
            opt.zero_grad(set_to_none=True)
            loss = half_loss(model, step, h)
            loss.backward()
            gs = [p.grad.detach().clone() for p in model.parameters()]
            grads = gs if grads is None else [a + b for a, b in zip(grads, gs)]
            total = loss.detach() if total is None else total + loss.detach()
        for p, g in zip(model.parameters(), grads):
            p.grad = g
    for p in model.parameters():
        p.grad.div_(HALVES)
    opt.step()
    return float(total / HALVES)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("rank", type=int)
    ap.add_argument("world", type=int)
    ap.add_argument("init")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--interval", type=int, default=5)
    ap.add_argument("--no-checkpoint", action="store_true")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--keep", type=int, default=3, help="checkpoints kept (0: all)")
    a = ap.parse_args()
    import goodput.ckpt as gc

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if a.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank, world_size=a.world)
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # Adam's state must exist to be loaded in place: one zero-learning-rate step creates it
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    lr = opt.param_groups[0]["lr"]
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    opt.param_groups[0]["lr"] = lr
    for s in opt.state.values():
        s["step"].zero_()
    opt.zero_grad(set_to_none=True)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    start, ck, t_restore = 0, None, 0.0
    if not a.no_checkpoint:
        t0 = time.perf_counter()
        ck = gc.Checkpointer(a.root, interval=a.interval, keep=a.keep or None, mode="process")
        ck.add_listener(
            lambda ev: print(
                json.dumps({"commit": ev.step, "stall_s": ev.stall_s, "write_s": ev.write_s, "bytes": ev.bytes}),
                flush=True,
            )
        )
        restored = ck.restore(state)
        if restored is not None:
            opt.load_state_dict(state["optim"])
            start = restored
        t_restore = time.perf_counter() - t0
    print(json.dumps({"ready": start, "restore_s": t_restore, "t": time.time()}), flush=True)
    for step in range(start, a.steps):
        t0 = time.perf_counter()
        loss = train_step(model, opt, step, a.rank, a.world)
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if ck is not None:
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            ck.maybe_save(step + 1, state)
        print(json.dumps({"step": step + 1, "loss": loss.hex(), "s": time.perf_counter() - t0}), flush=True)
    if ck is not None:
        # the final step kept: saved and committed (a due save skipped at the end is made up), or an error
        ck.close(a.steps, {"model": model.state_dict(), "optim": opt.state_dict()})
    if a.world > 1:
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
