"""The PyTorch peer of bench/ckpt_stall.sh: periodic asynchronous checkpoints with PyTorch
Distributed Checkpoint (DCP) during training of a model of the same shape and state size.

The model is transformers' LlamaForCausalLM with MegaC's dense-a widths (DESIGN.md: d=2048,
16 heads of 128, SwiGLU 8192, 6 layers, vocab 32896 untied), fp32 parameters under bf16
autocast, fused AdamW: the checkpointed state is parameters + exp_avg + exp_avg_sq in fp32,
12 bytes a parameter, as MegaC's. Each step: micro-batches of random tokens (speed only),
loss.item() at the end (the step time is the host's wall time to that sync).

--mode plain: dcp.async_save(state, checkpoint_id) as the DCP docs show it (the call stages
              the state to CPU memory before returning, then a thread writes).
--mode stager: torch 2.11's own form of torchtitan's "zero-overhead" setting (async_mode =
              mem_pinned): a DefaultStager with pinned, shared memory and non-blocking copies,
              AsyncCheckpointerType.PROCESS; the next optimizer step waits for the staging to
              finish (as torchtitan's maybe_wait_for_staging does), the write continues in a
              separate process.
--mode pinned: the same idea as torchtitan first wrote it: one pinned, shared CPU copy of the
              state made once (_create_cpu_state_dict), each save's device-to-host copy queued
              on a side stream (_copy_state_dict, non_blocking), the next optimizer step queued
              behind it on the GPU (no host wait), and after that step dcp.async_save of the
              CPU copy with AsyncCheckpointerType.PROCESS.
Before each save the previous one's upload is awaited (part of the pause, as in MegaC).

--load: after the run, the last checkpoint is loaded back into the model's and optimizer's
        GPU tensors by dcp.load, its files' pages dropped first (cold, as a resume).
--load-from DIR under torchrun with several processes: the model fully sharded (FSDP2
        fully_shard per decoder layer and the root), one step to create the optimizer state,
        then dcp.load of DIR (saved by one process) into those sharded tensors: DCP's
        load-time resharding, timed cold; no training.

Prints one JSON document: steady step time, each save's pause, and the steps that ran while
a save was still writing, and the load time when asked."""

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
    ap.add_argument("--mode", choices=["plain", "stager", "pinned"], default="plain")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--load-from")
    a = ap.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world)
    pg = dist.new_group(backend="gloo")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32896, hidden_size=2048, intermediate_size=8192, num_hidden_layers=6,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=a.seq,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    dev = torch.device("cuda")
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    if a.load_from:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
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

    def step_once():
        for _ in range(a.n_micro):
            tok = torch.randint(0, cfg.vocab_size, (a.micro, a.seq + 1), device=dev, generator=g)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fwd(input_ids=tok[:, :-1], labels=tok[:, 1:])
            (out.loss / a.n_micro).backward()
        return out

    def timed_load(ckpt):
        """dcp.load of ckpt into this process's tensors, the files' pages dropped first."""
        s = state()
        if rank == 0:
            for root, _, files in os.walk(ckpt):
                for f in files:
                    fd = os.open(os.path.join(root, f), os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
        dist.barrier(group=pg)
        torch.cuda.synchronize()
        t = time.perf_counter()
        dcp.load(s, checkpoint_id=ckpt, process_group=pg)
        torch.cuda.synchronize()
        dist.barrier(group=pg)
        nbytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(ckpt) for f in fs)
        return time.perf_counter() - t, nbytes

    if a.load_from:  # DCP's load-time resharding: one process's checkpoint into FSDP2 shards
        step_once()
        opt.step()
        opt.zero_grad(set_to_none=True)
        secs, nbytes = timed_load(a.load_from)
        if rank == 0:
            print(json.dumps({"peer": f"dcp load into FSDP2 on {world} GPUs", "load_s": secs, "file_bytes": nbytes,
                              "load_GBps": nbytes / secs / 1e9}))
        dist.destroy_process_group()
        return

    stager = None
    kwargs = {}
    if a.mode in ("stager", "pinned"):
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        kwargs = dict(async_checkpointer_type=AsyncCheckpointerType.PROCESS)
    if a.mode == "stager":
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        stager = DefaultStager(StagingOptions(True, True, True, True))
        kwargs["async_stager"] = stager
    if a.mode == "pinned":
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        side = torch.cuda.Stream()
    cpu_sd = None      # pinned mode: the pinned, shared CPU copy
    staged = None      # pinned mode: (event after the copy, checkpoint id) of the save to start

    upload = None      # future of the write in flight
    staging = None     # future of the staging in flight (stager mode)
    times, pauses = [], []
    state_bytes = 0
    last_ckpt = None
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        out = step_once()
        if staging is not None:
            staging.result()  # the state must not change while it is being staged
            staging = None
        if staged is not None:  # the GPU waits for the copy before the optimizer changes the state
            torch.cuda.current_stream().wait_event(staged[0])
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        t_step = time.perf_counter() - t0
        if staged is not None:  # the copy is done: hand the CPU copy to the writing process
            ts = time.perf_counter()
            staged[0].synchronize()
            upload = dcp.async_save(cpu_sd, checkpoint_id=staged[1], process_group=pg, **kwargs)
            staged = None
            pauses[-1] += time.perf_counter() - ts
            t_step += time.perf_counter() - ts
        writing = upload is not None and not upload.done()
        times.append((step, t_step, writing))
        if step % a.every == 0 and step < a.steps:
            ts = time.perf_counter()
            if upload is not None:
                upload.result()
            s = state()
            state_bytes = sum(v.numel() * v.element_size() for v in s.values())
            last_ckpt = os.path.join(a.dir, f"step_{step}")
            if a.mode == "pinned":
                if cpu_sd is None:
                    cpu_sd = _create_cpu_state_dict(s, pin_memory=True, share_memory=True)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    _copy_state_dict(s, cpu_sd, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(side)
                staged = (ev, last_ckpt)
            else:
                r = dcp.async_save(s, checkpoint_id=last_ckpt, process_group=pg, **kwargs)
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
    res = {
        "peer": f"dcp async_save ({a.mode})", "params": n_params, "state_bytes": state_bytes,
        "tokens_per_step": a.micro * a.n_micro * a.seq, "steady_step_s": steady,
        "pauses_s": pauses, "drain_steps": len(drain),
        "drain_worst_slowdown": (max(drain) / steady - 1) if drain else None,
        "drain_median_slowdown": (statistics.median(drain) / steady - 1) if drain else None,
        "last_loss": loss,
    }
    if a.load and last_ckpt:
        res["load_s"], res["load_file_bytes"] = timed_load(last_ckpt)
        res["load_GBps"] = res["load_file_bytes"] / res["load_s"] / 1e9
    print(json.dumps(res))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
