# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A small real training loop for the GPU validation: torch.compile, bf16, tokens/s logged.

    python train_loop.py --steps 300 [--batch 32] [--seq 1024] [--dim 1024] [--layers 4]
                         [--sleep 0] [--reserve-gib 0] [--forever] [--dlopen PATHS]

A causal-LM-shaped stack (embedding, pre-norm MLP blocks, tied head) trained on random
tokens with AdamW. Every --log-every steps it prints `step N loss L T tokens/s`. --sleep
adds a delay per step (an injected slowdown); --reserve-gib holds extra GPU memory (a
job's activations and caches); --forever keeps training (a job left running); --dlopen loads
each shared object of a comma list (a glob pattern: its first match) with ctypes.CDLL once torch
is imported, as an extension or a stray import would: it is then in the job's /proc/<pid>/maps.
"""

import argparse
import ctypes
import glob
import os
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _layer in range(layers))
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--reserve-gib", type=float, default=0.0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--forever", action="store_true")
    ap.add_argument("--dlopen", default="")
    args = ap.parse_args()
    for pattern in filter(None, args.dlopen.split(",")):
        found = sorted(glob.glob(pattern))
        if not found:
            ap.error("--dlopen %s: no file matches" % pattern)
        ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
        print("loaded %s" % found[0], flush=True)

    torch.manual_seed(0)
    dev = torch.device("cuda")
    reserve = torch.empty(int(args.reserve_gib * (1 << 30)), dtype=torch.uint8, device=dev) if args.reserve_gib else None
    model = Model(args.vocab, args.dim, args.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_fn = torch.compile(model)
    print("pid %d torch %s cuda %s device %s compile start" % (
        os.getpid(), torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)), flush=True)
    tokens_per_step = args.batch * args.seq
    t0 = time.perf_counter()
    window_start, window_steps = time.perf_counter(), 0
    step = 0
    while args.forever or step < args.steps:
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.sleep:
            time.sleep(args.sleep)
        step += 1
        window_steps += 1
        if step == 1:
            torch.cuda.synchronize()
            print("step 1 compiled in %.1f s" % (time.perf_counter() - t0), flush=True)
            window_start, window_steps = time.perf_counter(), 0
        elif step % args.log_every == 0:
            torch.cuda.synchronize()
            now = time.perf_counter()
            rate = tokens_per_step * window_steps / (now - window_start)
            print("step %d loss %.4f %.0f tokens/s" % (step, loss.item(), rate), flush=True)
            window_start, window_steps = now, 0
    del reserve
    print("done %d steps in %.1f s" % (step, time.perf_counter() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
