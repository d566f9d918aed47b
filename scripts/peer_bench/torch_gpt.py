"""The PyTorch peer of `zero-bench train`: the same GPT-2 (tied token table, pre-norm blocks,
tanh GELU, causal attention, biases everywhere, AdamW) trained on random tokens, in one of
PyTorch's data-parallel forms. Prints one JSON line with the median step time.

Run by scripts/peer_bench/run.py, under `torchrun` for several ranks (gloo, CPU):

    torchrun --standalone --nproc-per-node 2 torch_gpt.py --mode ddp --vocab 4096 ...

Modes (what each zero-rs stage is compared with):
    single  one process, plain AdamW                     (zero-rs on 1 rank, stage 0)
    ddp     DistributedDataParallel                      (stage 0)
    zero1   ZeroRedundancyOptimizer around AdamW + DDP    (stage 1)
    fsdp2-grad  fully_shard, reshard_after_forward=False  (stage 2: grads and states sharded)
    fsdp2   fully_shard, reshard_after_forward=True       (stage 3: parameters too)
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, as GPT-2
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", required=True,
                    choices=["single", "ddp", "zero1", "fsdp2-grad", "fsdp2"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: CPU autocast (bf16 matmuls via oneDNN), fp32 master weights")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    distributed = args.mode != "single"
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(1234)
    model = Gpt(args.vocab, args.seq_len, args.layers, args.heads, args.width)
    n_params = sum(p.numel() for p in model.parameters())

    def adamw(params):
        return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    if args.mode == "single":
        opt = adamw(model.parameters())
    elif args.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
        opt = adamw(model.parameters())
    elif args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        from torch.distributed.fsdp import fully_shard
        reshard = args.mode == "fsdp2"
        for block in model.h:
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        opt = adamw(model.parameters())

    gen = torch.Generator().manual_seed(1000 + rank)
    shape = (args.micro_batch, args.seq_len)
    times, losses = [], []
    for _ in range(args.steps):
        idx = torch.randint(args.vocab, shape, generator=gen)
        targets = torch.randint(args.vocab, shape, generator=gen)
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if distributed:
        # Each rank's step ends at its own time: the slowest rank's median is the step.
        t = torch.tensor([statistics.median(times[args.warmup:])])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        median = t.item()
        dist.destroy_process_group()
    else:
        median = statistics.median(times[args.warmup:])
    if rank == 0:
        assert all(math.isfinite(x) for x in losses), losses
        print(json.dumps({
            "system": "pytorch", "torch": torch.__version__, "mode": args.mode,
            "precision": args.precision, "ranks": world, "threads": args.threads,
            "params": n_params, "step_seconds": median, "first_loss": losses[0],
            "last_loss": losses[-1],
        }))


if __name__ == "__main__":
    main()
    # Skip the interpreter's teardown: with FSDP2 on gloo, torch 2.15 sometimes aborts
    # there ("terminate called without an active exception") after the run is complete.
    sys.stdout.flush()
    os._exit(0)
