"""The PyTorch peer of bench/ckpt_stall.sh: periodic asynchronous checkpoints with PyTorch
Distributed Checkpoint (DCP) during training of a model of the same shape and state size.

The model is transformers' LlamaForCausalLM with MegaC's dense-a widths (DESIGN.md: d=2048,
16 heads of 128, SwiGLU 8192, 6 layers, vocab 32896 untied), fp32 parameters under bf16
autocast, fused AdamW: the checkpointed state is parameters + exp_avg + exp_avg_sq in fp32,
12 bytes a parameter, as MegaC's. Each step: micro-batches of random tokens (speed only),
loss.item() at the end (the step time is the host's wall time to that sync).

--mode plain: dcp.async_save(state, checkpoint_id) as the DCP docs show it (the call stages
              the state to CPU memory before returning, then a thread writes).
--mode pinned: torchtitan's "zero-overhead" setting (async_mode = mem_pinned): a DefaultStager
              with pinned, shared memory and non-blocking copies, AsyncCheckpointerType.PROCESS;
              the next optimizer step waits for the staging to finish (as torchtitan's
              maybe_wait_for_staging does), the write continues in a separate process.
Before each save the previous one's upload is awaited (part of the pause, as in MegaC).

Prints one JSON document: steady step time, each save's pause, and the steps that ran while
a save was still writing."""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=40)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--n-micro", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mode", choices=["plain", "pinned"], default="plain")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    pg = dist.new_group(backend="gloo")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32896, hidden_size=2048, intermediate_size=8192, num_hidden_layers=6,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=a.seq,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    dev = torch.device("cuda")
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    fwd = torch.compile(model) if a.compile else model
    g = torch.Generator(device=dev).manual_seed(1)

    def state():
        s = {}
        for n, p in model.named_parameters():
            s[f"model.{n}"] = p.detach()  # a plain tensor on the same storage (the stager deep-copies)
            st = opt.state.get(p)
            if st:
                s[f"optim.{n}.exp_avg"] = st["exp_avg"]
                s[f"optim.{n}.exp_avg_sq"] = st["exp_avg_sq"]
        return s

    stager = None
    kwargs = {}
    if a.mode == "pinned":
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        stager = DefaultStager(StagingOptions(True, True, True, True))
        kwargs = dict(async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=stager)

    upload = None      # future of the write in flight
    staging = None     # future of the staging in flight (pinned mode)
    times, pauses, drain_steps = [], [], []
    state_bytes = 0
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        for _ in range(a.n_micro):
            tok = torch.randint(0, cfg.vocab_size, (a.micro, a.seq + 1), device=dev, generator=g)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fwd(input_ids=tok[:, :-1], labels=tok[:, 1:])
            (out.loss / a.n_micro).backward()
        if staging is not None:
            staging.result()  # the state must not change while it is being staged
            staging = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        t_step = time.perf_counter() - t0
        writing = upload is not None and not upload.done()
        times.append((step, t_step, writing))
        if step % a.every == 0 and step < a.steps:
            ts = time.perf_counter()
            if upload is not None:
                upload.result()
            s = state()
            state_bytes = sum(v.numel() * v.element_size() for v in s.values())
            r = dcp.async_save(s, checkpoint_id=os.path.join(a.dir, f"step_{step}"), process_group=pg, **kwargs)
            # a Future, or (with a stager that stages asynchronously) an AsyncSaveResponse
            upload = getattr(r, "upload_completion", r)
            staging = getattr(r, "staging_completion", None)
            pauses.append(time.perf_counter() - ts)
    if upload is not None:
        upload.result()
    if stager is not None:
        stager.close()
    steady = statistics.median(t for s, t, w in times if s > 3 and not w)
    drain = [t for s, t, w in times if s > 3 and w]
    print(json.dumps({
        "peer": f"dcp async_save ({a.mode})", "params": n_params, "state_bytes": state_bytes,
        "tokens_per_step": a.micro * a.n_micro * a.seq, "steady_step_s": steady,
        "pauses_s": pauses, "drain_steps": len(drain),
        "drain_worst_slowdown": (max(drain) / steady - 1) if drain else None,
        "drain_median_slowdown": (statistics.median(drain) / steady - 1) if drain else None,
        "last_loss": loss,
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
