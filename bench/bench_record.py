"""One benchmark run's record, shared by bench/megac_run.py and bench/torch_hybrid.py so that
both sides report the same fields, the same model FLOP/s and MFU, and the same RESULT line."""


def add_model_flops(res, flops_per_token, peak_tflops):
    """Model TFLOP/s from mcplan's training FLOPs per token, and MFU against the measured bf16
    peak (each only when given)."""
    if not flops_per_token:
        return
    res["flops_per_token"] = flops_per_token
    res["model_tflops"] = flops_per_token * res["tokens_per_s"] / 1e12
    if peak_tflops:
        res["peak_tflops"] = peak_tflops
        res["mfu"] = res["model_tflops"] / peak_tflops


def result_line(res):
    """The RESULT line of a record (config, mode, dtype, step times, tokens/s, memory, MFU)."""
    line = (f"RESULT {res['config']} {res['mode']} {res['dtype']}: step {res['step_s_median'] * 1e3:.1f} ms "
            f"(median of {res['timed_steps']}, min {res['step_s_min'] * 1e3:.1f}, max {res['step_s_max'] * 1e3:.1f}), "
            f"{res['tokens_per_s']:.0f} tokens/s, first step {res['first_step_s']:.1f} s, "
            f"peak mem {res['max_mem_gib']:.1f} GiB")
    if "mfu" in res:
        line += f", {res['model_tflops']:.1f} model TFLOP/s, MFU {100 * res['mfu']:.1f}%"
    return line
