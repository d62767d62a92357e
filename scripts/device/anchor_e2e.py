#!/usr/bin/env python3
"""The PyTorch anchor of `liger bench --e2e`: whole training steps of Hugging Face
transformers models, without Liger-Kernel (provider `torch`) and with it (provider
`torch+liger-kernel`), on the shapes and protocol of the Rust benchmark, written as rows of
the project's bench CSV so one plot (scripts/plot_e2e.py) draws all of them.

Models (built from their configs, written here, random init, seeded; nothing downloaded):
  llama3.2-1b   16 layers, hidden 2048, 32/8 heads of 64, MLP 8192, vocabulary 128256,
                llama3 RoPE (theta 5e5, factor 32), RMSNorm eps 1e-5, tied embeddings
  qwen2.5-1.5b  28 layers, hidden 1536, 12/2 heads of 128, MLP 8960, vocabulary 151936,
                q/k/v biases, RoPE theta 1e6, RMSNorm eps 1e-6, tied embeddings
  llama3-8b     32 layers, hidden 4096, 32/8 heads of 128, MLP 14336, vocabulary 128256,
                llama3 RoPE (theta 5e5, factor 8), untied (with --lora-rank: the 8B case)
  tiny-llama, tiny-qwen2   vocabulary 128, hidden 64, 2 layers, 4/2 heads of 16 (CPU checks
                of this script; tiny-llama is liger-models' ModelConfig::tiny(Llama))

Protocol (the same as examples/src/bench/e2e_case.rs):
  - one process per case (model x seq x provider), so an out-of-memory error or a crash is
    that case's status (`oom`, `error`, `timeout`) and the run goes on; once a provider
    fails at a length its longer lengths are `skipped`;
  - weights and activations in --dtype (bf16), attention `sdpa`, AdamW with Burn's
    AdamWConfig defaults (lr --lr, default 1e-5, betas 0.9/0.999, eps 1e-5, decoupled weight decay 1e-4),
    batch --batch of --seq tokens, token ids uniform over the vocabulary (seeded), labels =
    inputs (every next token scored: the mean over batch x (seq - 1) tokens);
  - a step = forward + loss + backward + optimizer step + zero_grad(set_to_none), then a
    device synchronization; --warmup untimed steps, the allocator's cache emptied
    (torch.cuda.empty_cache) before the last of them, then --steps timed steps (synchronize,
    clock, step, synchronize, clock), then one memory step synchronized after each phase;
  - tokens/s = batch x seq / median step time (p20/p80 from the step-time quantiles);
  - peak_reserved_MiB = torch.cuda.max_memory_reserved over the timed steps and the memory
    step (peak statistics reset after the warm-up): what the caching allocator held from
    the device, as the Rust side's CubeCL pool `bytes_reserved`;
  - peak_in_use_MiB = the largest torch.cuda.memory_allocated read after each timed step
    and after the memory step's forward+loss, backward and optimizer phases: the samples
    the Rust side takes of the pool's `bytes_in_use`, so both columns mean the same;
  - peak_allocated_MiB = torch.cuda.max_memory_allocated over the same steps: the true
    peak of live tensor bytes (no Rust counterpart: CubeCL keeps no high-water mark);
  - loss = the memory step's loss; every step's loss is listed in the config column;
  - with --lora-rank N (the counterpart of `liger bench --e2e --e2e-lora-rank N`): PEFT's
    LoRA (peft.get_peft_model, after Liger-Kernel's patch) with r N, lora_alpha 2N, no
    dropout, on --lora-targets (default all-linear = q,k,v,o,gate,up,down); the base
    frozen in --dtype, the adapters f32 (PEFT's autocast_adapter_dtype), AdamW over the
    adapters only. Liger-Kernel's fused linear cross entropy reads lm_head.weight only, so
    an lm_head adapter is refused with the liger provider (it would silently not train);
  - with --gradient-checkpointing (the counterpart of `--e2e-gradient-checkpointing on`):
    transformers' gradient_checkpointing_enable(use_reentrant=False), each decoder layer
    run again in the backward.

Rows: kernel = model, provider, mode = train_step, x = seq, metric in tokens/s, step_ms,
peak_reserved_MiB, peak_in_use_MiB, peak_allocated_MiB, loss; config starts with
`status=ok|oom|error|timeout|skipped`; a case that did not finish has one tokens/s row with
empty numbers and the reason in config (detail=...).

Needs: torch, transformers (5.x: configs with rope_parameters), and for the liger provider
liger-kernel (0.8.5 was the one written against; it needs only torch and triton); peft for
--lora-rank.

Example (device machine, 1K/4K/16K, both models, both providers, about 6 min on an H100):
    python3 scripts/device/anchor_e2e.py --csv $OUT/anchor_e2e.csv
Tiny check on a CPU (torch only; liger-kernel needs a GPU):
    python3 scripts/device/anchor_e2e.py --tiny --device cpu --providers torch --csv /tmp/a.csv
LoRA rank 64 on every linear layer of the decoder, 1K and 4K (issue 15's comparison):
    python3 scripts/device/anchor_e2e.py --lora-rank 64 --seq 1024,4096 --csv $OUT/anchor_e2e.csv
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_csv  # noqa: E402

RESULT_PREFIX = "ANCHOR_E2E_RESULT "
PROVIDERS = ("torch", "torch+liger-kernel")
# A case is not started with less of --budget left (import, model build and warm-up alone
# take about as long on a GPU).
MIN_CASE_SECONDS = 30
MIB = float(1 << 20)

# Burn's AdamWConfig defaults, which `liger bench --e2e` trains with (lr from e2e_case.rs).
ADAMW = dict(betas=(0.9, 0.999), eps=1e-5, weight_decay=1e-4)
DEFAULT_LR = 1e-5


def sci(x):
    """`x` as Rust's `{:e}` writes it (1e-5, 2.5e-4): the CSV's optimizer names match."""
    mantissa, exponent = f"{x:.15e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"

# transformers 5 configs. `arch` picks the config class; the rest are its fields.
MODELS = {
    "llama3.2-1b": dict(
        arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)),
    "qwen2.5-1.5b": dict(
        arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
    "llama3-8b": dict(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)),
    "tiny-llama": dict(
        arch="llama", vocab_size=128, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64)),
    "tiny-qwen2": dict(
        arch="qwen2", vocab_size=128, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, max_position_embeddings=32768, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
}
TINY_SEQS = "32,64"

# LoRA targets as `liger bench --e2e-lora-targets` reads them, in liger-models' order.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head")
ALL_LINEAR = LORA_MODULES[:7]


def lora_targets(text):
    """`q,k,...,lm_head`, the _proj names or all-linear -> sorted module names."""
    out = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "all-linear":
            out.update(ALL_LINEAR)
            continue
        name = next((m for m in LORA_MODULES if item in (m, m.removesuffix("_proj"))), None)
        if name is None:
            raise argparse.ArgumentTypeError(
                f"unknown LoRA target {item!r} (known: {', '.join(LORA_MODULES)}, the short "
                "names q, k, v, o, gate, up, down, or all-linear)")
        out.add(name)
    if not out:
        raise argparse.ArgumentTypeError("no LoRA target given")
    return [m for m in LORA_MODULES if m in out]


def csv_list(kind):
    def parse(s):
        return [kind(v) for v in s.split(",") if v.strip()]
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Models"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", metavar="PATH",
                   help="append the rows to this CSV (bench layout; header written when the "
                        "file is new). Without it only the table is printed.")
    p.add_argument("--models", type=csv_list(str), default=None, metavar="MODEL,...",
                   help="models, comma list: llama3.2-1b, qwen2.5-1.5b, llama3-8b, tiny-llama, tiny-qwen2 "
                        "(default: llama3.2-1b,qwen2.5-1.5b; with --tiny: the tiny ones)")
    p.add_argument("--seq", type=csv_list(int), default=None, metavar="N,...",
                   help="sequence lengths, comma list, run in ascending order (default "
                        f"1024,4096,16384; add 32768 for the longest case; with --tiny: {TINY_SEQS})")
    p.add_argument("--providers", type=csv_list(str), default=list(PROVIDERS),
                   metavar="P,...",
                   help="torch (transformers as is) and/or torch+liger-kernel "
                        "(apply_liger_kernel_to_llama/_qwen2: RoPE, RMSNorm, SwiGLU, fused "
                        "linear cross entropy; applied before the model is built). "
                        "Default: both, torch first at each length.")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny models and lengths (a check of this script, e.g. with "
                        "--device cpu); --models / --seq still override")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="sequences per step (default 1, as `liger bench --e2e`)")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help="untimed steps first; the cache is emptied before the last one "
                        "(default 2, as --e2e-warmup)")
    p.add_argument("--steps", type=int, default=3, metavar="N",
                   help="timed steps; tokens/s from their median (default 3, as --e2e-steps)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="decoder layers of every model instead of the preset's (as "
                        "--e2e-layers)")
    p.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16",
                   help="dtype of the weights, activations and optimizer state (default bf16)")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                   help="transformers' attn_implementation (default sdpa: flash / "
                        "memory-efficient kernels, memory linear in the sequence)")
    p.add_argument("--sdpa-backend", choices=("default", "flash", "cudnn", "efficient"),
                   default="default",
                   help="with --attn sdpa: the only kernel torch may use (default: torch's own "
                        "choice, as transformers leaves it). Recorded in the config column.")
    p.add_argument("--adamw-impl", choices=("default", "foreach", "fused", "for-loop"),
                   default="default",
                   help="torch.optim.AdamW implementation: default (torch's choice: foreach "
                        "on CUDA), foreach, fused, or for-loop (one parameter at a time, as "
                        "Burn's optimizer). Recorded in the config column.")
    p.add_argument("--lora-rank", type=int, default=None, metavar="N",
                   help="LoRA fine-tuning steps with PEFT: rank N, alpha 2N, no dropout, on "
                        "--lora-targets; only the adapters train (as --e2e-lora-rank)")
    p.add_argument("--lora-targets", type=lora_targets, default=list(ALL_LINEAR),
                   metavar="LIST",
                   help="with --lora-rank: adapted modules, comma list (q, k, v, o, gate, up, "
                        "down, lm_head, all-linear; default all-linear)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="model.gradient_checkpointing_enable() (non-reentrant): each decoder "
                        "layer recomputed in the backward, as `liger bench --e2e "
                        "--e2e-gradient-checkpointing on`. Recorded in the config column.")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, metavar="LR",
                   help=f"AdamW's learning rate (default {DEFAULT_LR:g}, as --e2e-lr)")
    p.add_argument("--start", default=None, metavar="DIR",
                   help="train from the starting points `liger bench --e2e --e2e-save-start "
                        "DIR` wrote: each case's model, LoRA adapter (with --lora-rank) and "
                        "token ids from DIR/MODEL_BATCHxSEQ instead of a seeded random start, "
                        "so the per-step losses compare with the Rust run's "
                        "(scripts/compare_losses.py)")
    p.add_argument("--device", default="cuda",
                   help="torch device (default cuda; cpu for --tiny checks: no memory metrics)")
    p.add_argument("--seed", type=int, default=0xE2E,
                   help="seed of the weights and token ids (default 0xE2E, as the Rust bench)")
    p.add_argument("--timeout", type=int, default=300, metavar="SECONDS",
                   help="seconds a case may take (import, build, steps) before its process is "
                        "killed and the case recorded as timeout (default 300)")
    p.add_argument("--budget", type=int, default=None, metavar="SECONDS",
                   help="seconds for the whole run: no case starts with less than "
                        f"{MIN_CASE_SECONDS} s of it left (recorded as skipped) and a case's "
                        "timeout is cut to what is left. Unlimited when absent.")
    p.add_argument("--no-skip", action="store_true",
                   help="run a provider's longer lengths even after it failed at a shorter one")
    p.add_argument("--case-log", metavar="PATH",
                   help="append every case's stderr (step times, tracebacks) to this file")
    p.add_argument("--gpu", default=os.environ.get("LIGER_GPU_NAME"),
                   help="gpu column (default $LIGER_GPU_NAME, else the device's name)")
    p.add_argument("--commit", default=None,
                   help="commit column (default $LIGER_COMMIT, else .gpu/commit, else git HEAD)")
    p.add_argument("--kernel-profile", metavar="PATH", default=None,
                   help="after the memory step, one more step under torch.profiler (CUDA "
                        "activity only); every kernel's device time summed by name and "
                        "written to PATH.<model>_<seq>_<provider>.txt in the layout of "
                        "scripts/ncu_summary.py --total, to set beside ncu's view of the "
                        "Rust step")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.models is None:
        a.models = ["tiny-llama", "tiny-qwen2"] if a.tiny else ["llama3.2-1b", "qwen2.5-1.5b"]
    if a.seq is None:
        a.seq = csv_list(int)(TINY_SEQS if a.tiny else "1024,4096,16384")
    for m in a.models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    for pr in a.providers:
        if pr not in PROVIDERS:
            p.error(f"--providers: unknown provider {pr!r} (known: {', '.join(PROVIDERS)})")
    if any(s < 2 for s in a.seq):
        p.error("--seq: every length must be at least 2 (the loss is over next tokens)")
    if a.batch < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--batch and --steps must be at least 1, --warmup at least 0")
    if a.lora_rank is not None and a.lora_rank < 1:
        p.error("--lora-rank must be at least 1")
    if a.lora_rank is not None and "lm_head" in a.lora_targets \
            and "torch+liger-kernel" in a.providers:
        p.error("--lora-targets lm_head with the torch+liger-kernel provider: Liger-Kernel's "
                "fused linear cross entropy reads lm_head.weight and skips the adapter, so "
                "the comparison would not train the same parameters")
    return a


# ---------------------------------------------------------------------------------------
# One case, in its own process.


def is_oom(text):
    t = text.lower()
    return any(s in t for s in ("out of memory", "outofmemory", "cuda error: out of memory",
                                "cublas_status_alloc_failed", "failed to allocate"))


def start_dir(args, model, batch, seq):
    """The case's folder under --start (as `liger bench --e2e-save-start` names it), or None."""
    if args.start is None:
        return None
    path = os.path.join(args.start, f"{model}_{batch}x{seq}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--start: no {path}; run liger bench --e2e with "
                                f"--e2e-save-start {args.start} on this case first")
    return path


def build_config(name, layers):
    spec = dict(MODELS[name])
    arch = spec.pop("arch")
    if layers is not None:
        spec["num_hidden_layers"] = layers
    if arch == "llama":
        from transformers import LlamaConfig as Config
    else:
        from transformers import Qwen2Config as Config
    return Config(use_cache=False, **spec), arch


def apply_liger(arch):
    """Liger-Kernel's patch of the transformers classes (before the model is built), with
    the kernels `liger bench --e2e` fuses: RoPE, RMSNorm, SwiGLU, fused linear CE."""
    from liger_kernel.transformers import (apply_liger_kernel_to_llama,
                                           apply_liger_kernel_to_qwen2)
    patch = apply_liger_kernel_to_llama if arch == "llama" else apply_liger_kernel_to_qwen2
    patch(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
          fused_linear_cross_entropy=True)


def liger_patched(model, arch):
    """Which Liger-Kernel replacements the built model runs (from its classes)."""
    import importlib
    base = model.model
    modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    found = []
    if type(base.norm).__name__.startswith("Liger"):
        found.append("rms_norm")
    if type(base.layers[0].mlp).__name__.startswith("Liger"):
        found.append("swiglu")
    if "liger" in getattr(modeling.apply_rotary_pos_emb, "__module__", ""):
        found.append("rope")
    if "liger" in getattr(type(model).forward, "__module__", ""):
        found.append("fused_linear_cross_entropy")
    return found


def run_case(args, model_name, seq, batch, provider):
    """Builds and trains one case; returns the result dict (status ok / oom / error)."""
    out = {"status": "error", "detail": "", "tokens": batch * seq, "step_ms": [],
           "losses": [], "phase_ms": []}
    try:
        import torch
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
        device = torch.device(args.device)
        cuda = device.type == "cuda"
        out["device_name"] = torch.cuda.get_device_name(device) if cuda else args.device
        out["versions"] = bench_csv.versions()
        config, arch = build_config(model_name, args.layers)
        start = start_dir(args, model_name, batch, seq)
        if provider == "torch+liger-kernel":
            apply_liger(arch)
        from transformers import AutoModelForCausalLM
        torch.manual_seed(args.seed)
        if start is not None:
            # The Rust run's starting point: its model, adapter and tokens.
            model = AutoModelForCausalLM.from_pretrained(
                start, dtype=dtype, attn_implementation=args.attn).to(device)
            if model.config.vocab_size != config.vocab_size:
                raise ValueError(f"--start {start}: vocabulary {model.config.vocab_size}, "
                                 f"not {model_name}'s {config.vocab_size}")
        else:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                         attn_implementation=args.attn)
        out["params"] = sum(p.numel() for p in model.parameters())
        out["attn"] = getattr(model.config, "_attn_implementation", args.attn)
        if out["attn"] == "sdpa" and cuda:
            restrict_sdpa(args.sdpa_backend)
            out["attn"] += ":" + sdpa_choice(model.config, batch, seq, dtype, device)
        out["liger_patched"] = liger_patched(model, arch)
        if args.lora_rank is not None and start is not None:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, os.path.join(start, "adapter"),
                                              is_trainable=True)
            out["params"] = sum(p.numel() for p in model.parameters())
        elif args.lora_rank is not None:
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(model, LoraConfig(
                r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                target_modules=list(args.lora_targets), task_type="CAUSAL_LM"))
            out["params"] = sum(p.numel() for p in model.parameters())
        model.train()
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        out["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
                "for-loop": {"foreach": False}}[args.adamw_impl]
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                lr=args.lr, **ADAMW, **impl)
        if start is not None:
            with open(os.path.join(start, "tokens.json")) as f:
                ids = torch.tensor(json.load(f)["input_ids"], dtype=torch.long)
            if tuple(ids.shape) != (batch, seq):
                raise ValueError(f"--start {start}: tokens of shape {tuple(ids.shape)}, "
                                 f"not [{batch}, {seq}]")
            ids = ids.to(device)
        else:
            gen = torch.Generator().manual_seed(args.seed)
            ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
        labels = ids

        def sync():
            if cuda:
                torch.cuda.synchronize(device)

        def step(sample):
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
            sample()
            loss.backward()
            sample()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        losses = []
        nothing = lambda: None  # noqa: E731
        for i in range(args.warmup):
            if i == args.warmup - 1 and cuda:
                # Emptied before the last warm-up step: the cache regrows to what a step
                # needs from a clean start, and the timed steps do not pay that growth.
                sync()
                torch.cuda.empty_cache()
            t = time.perf_counter()
            losses.append(step(nothing))
            sync()
            print(f"warmup {i}: {(time.perf_counter() - t) * 1e3:.1f} ms", file=sys.stderr)
        sync()
        if cuda:
            if args.warmup == 0:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        in_use = []

        def read_in_use():
            if cuda:
                in_use.append(torch.cuda.memory_allocated(device))

        for i in range(args.steps):
            sync()
            t = time.perf_counter()
            losses.append(step(nothing))
            sync()
            ms = (time.perf_counter() - t) * 1e3
            out["step_ms"].append(ms)
            read_in_use()
            print(f"step {i}: {ms:.1f} ms", file=sys.stderr)
        # The memory step: synchronized after each phase, in use read there.
        marks = [time.perf_counter()]

        def sample():
            sync()
            marks.append(time.perf_counter())
            read_in_use()

        sync()
        marks[0] = time.perf_counter()
        losses.append(step(sample))
        sample()
        out["phase_ms"] = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
        if args.kernel_profile and cuda:
            write_kernel_profile(f"{args.kernel_profile}.{model_name}_{seq}_{provider}.txt",
                                 lambda: (step(nothing), sync()))
        out["losses"] = [float(v) for v in losses]
        out["loss"] = out["losses"][-1]
        if cuda:
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_in_use"] = max(in_use)
            free, total = torch.cuda.mem_get_info(device)
            out["device_used"] = total - free
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - every failure is the case's result
        import traceback
        text = f"{type(e).__name__}: {e}"
        out["status"] = "oom" if is_oom(text) or type(e).__name__ == "OutOfMemoryError" else "error"
        out["detail"] = " | ".join(text.strip().splitlines()[:3])[:400]
        traceback.print_exc(file=sys.stderr)
    return out


def write_kernel_profile(path, run_step):
    """One step under torch.profiler: the kernels' (and copies') device time by name."""
    import collections
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_step()
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        entry = by_name[e.name.split("(")[0].split("<")[0]]
        entry[0] += e.time_range.elapsed_us() / 1e3
        entry[1] += 1
    launches = sum(n for _, n in by_name.values())
    ms = sum(t for t, _ in by_name.values())
    with open(path, "w") as f:
        f.write(f"{launches} launches, {ms:.3f} ms of kernel time\n")
        for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
            f.write(f"{t:10.3f} ms {n:6} x  {name[:90]}\n")


# ---------------------------------------------------------------------------------------
# The parent: every case in a child process, rows, table.


def child_argv(args, case):
    a = [sys.executable, os.path.abspath(__file__), "--case", case,
         "--warmup", str(args.warmup), "--steps", str(args.steps), "--dtype", args.dtype,
         "--attn", args.attn, "--sdpa-backend", args.sdpa_backend,
         "--adamw-impl", args.adamw_impl, "--device", args.device,
         "--seed", str(args.seed), "--lr", repr(args.lr)]
    if args.start is not None:
        a += ["--start", args.start]
    if args.layers is not None:
        a += ["--layers", str(args.layers)]
    if args.kernel_profile is not None:
        a += ["--kernel-profile", args.kernel_profile]
    if args.lora_rank is not None:
        a += ["--lora-rank", str(args.lora_rank), "--lora-targets", ",".join(args.lora_targets)]
    if args.gradient_checkpointing:
        a += ["--gradient-checkpointing"]
    return a


def log_case(args, case, stderr):
    if args.case_log:
        with open(args.case_log, "a") as f:
            f.write(f"== {case}\n{stderr or ''}\n")


def run_child(args, model, seq, provider, timeout):
    case = f"{model}:{seq}:{args.batch}:{provider}"
    start = time.time()
    proc = subprocess.Popen(child_argv(args, case), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # Built from configs: nothing is fetched (the device machine is offline).
                            env=dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
                                     TRANSFORMERS_OFFLINE="1"))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        log_case(args, case, stderr)
        return {"status": "timeout", "detail": f"no result within {timeout} s; killed",
                "wall_s": time.time() - start}
    log_case(args, case, stderr)
    result = None
    for ln in stdout.splitlines():
        if ln.startswith(RESULT_PREFIX):
            result = json.loads(ln[len(RESULT_PREFIX):])
    if result is None:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-3:]
        oom = next((ln for ln in stderr.splitlines() if is_oom(ln)), None)
        result = {"status": "oom" if oom else "error",
                  "detail": f"exit code {proc.returncode}: " + (oom or " | ".join(tail))[:400]}
    result["wall_s"] = time.time() - start
    return result


def restrict_sdpa(backend):
    """Leaves torch only `backend` for scaled_dot_product_attention (`default`: all)."""
    import torch
    if backend == "default":
        return
    torch.backends.cuda.enable_flash_sdp(backend == "flash")
    torch.backends.cuda.enable_cudnn_sdp(backend == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(backend == "efficient")
    torch.backends.cuda.enable_math_sdp(False)


def sdpa_choice(config, batch, seq, dtype, device):
    """The kernel torch's scaled_dot_product_attention picks by itself for this model's
    causal training attention (transformers passes no backend), e.g. flash_attention or
    cudnn_attention."""
    import torch
    from torch.nn.attention import SDPBackend
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q, k, v = (torch.empty(batch, h, seq, head_dim, dtype=dtype, device=device,
                           requires_grad=True) for h in (heads, kv_heads, kv_heads))
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True))
    except (AttributeError, RuntimeError, TypeError):
        return "unknown"
    names = {int(m.value): n.lower() for n, m in SDPBackend.__members__.items()}
    return names.get(choice, str(choice))


def config_text(args, provider, r):
    parts = [f"status={r['status']}", f"batch={args.batch}", f"dtype={args.dtype}",
             f"warmup={args.warmup}", f"steps={args.steps}",
             f"optimizer=adamw:lr={sci(args.lr)}:betas=0.9/0.999:eps=1e-5:wd=1e-4",
             f"adamw_impl={args.adamw_impl}", f"attention={r.get('attn', args.attn)}"]
    if args.layers is not None:
        parts.append(f"layers={args.layers}")
    if args.gradient_checkpointing:
        # As `liger bench --e2e --e2e-gradient-checkpointing on` writes it.
        parts.append("gradient_checkpointing=layers")
    if args.lora_rank is not None:
        # As `liger bench --e2e --e2e-lora-rank` writes it.
        parts.append(f"lora=r{args.lora_rank}:alpha{2 * args.lora_rank}:"
                     + "+".join(args.lora_targets))
    if provider == "torch+liger-kernel" and "liger_patched" in r:
        parts.append("liger=" + ("+".join(r["liger_patched"]) or "none"))
    if r.get("params"):
        parts.append(f"params={r['params']}")
    if args.lora_rank is not None and r.get("trainable"):
        parts.append(f"trainable={r['trainable']}")
    if r.get("loss") is not None:
        parts.append(f"loss={r['loss']:.4f}")
    if r.get("losses"):
        parts.append("losses=" + "/".join(f"{v:.4f}" for v in r["losses"]))
    if len(r.get("phase_ms", [])) == 3:
        p = r["phase_ms"]
        parts.append(f"phases_ms=fwd:{p[0]:.1f}/bwd:{p[1]:.1f}/opt:{p[2]:.1f}")
    if r.get("device_used") is not None:
        parts.append(f"device_used_mib={r['device_used'] / MIB:.0f}")
    if r.get("versions"):
        parts.append(r["versions"])
    parts.append("memory=torch-caching-allocator")
    if r.get("detail"):
        parts.append("detail=" + r["detail"][:200].replace("\n", " "))
    return " ".join(parts)


def case_rows(args, model, seq, provider, r):
    cfg = config_text(args, provider, r)
    # A forced SDPA kernel is another provider, so rows of torch's own choice stay apart.
    label = provider if args.sdpa_backend == "default" else f"{provider} (sdpa {args.sdpa_backend})"
    key = dict(kernel=model, provider=label, mode="train_step", x=seq)
    nan = float("nan")
    if r["status"] != "ok":
        return [bench_csv.row(metric="tokens/s", values=[nan] * 3, config=cfg, **key)]
    secs = [t / 1e3 for t in bench_csv.p50_20_80(r["step_ms"])]
    rows = [bench_csv.row(metric="tokens/s", values=bench_csv.rate(r["tokens"], secs),
                          config=cfg, **key),
            bench_csv.row(metric="step_ms", values=bench_csv.p50_20_80(r["step_ms"]),
                          config=cfg, **key)]
    for metric, field in (("peak_reserved_MiB", "peak_reserved"),
                          ("peak_in_use_MiB", "peak_in_use"),
                          ("peak_allocated_MiB", "peak_allocated")):
        if r.get(field) is not None:
            rows.append(bench_csv.row(metric=metric, values=[r[field] / MIB] * 3,
                                      config=cfg, **key))
    rows.append(bench_csv.row(metric="loss", values=[r["loss"]] * 3, config=cfg, **key))
    return rows


def fmt(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def tokens_per_s(r):
    if r["status"] != "ok":
        return None
    return r["tokens"] / (bench_csv.quantile(r["step_ms"], 0.5) / 1e3)


def render(results):
    head = ["model", "seq", "provider", "status", "tokens/s", "step ms p50", "reserved MiB",
            "in use MiB", "allocated MiB", "loss", "note"]
    lines = []
    for (model, seq, provider), r in results:
        ok = r["status"] == "ok"
        mib = lambda k: r[k] / MIB if ok and r.get(k) is not None else None  # noqa: E731
        lines.append([model, str(seq), provider, r["status"], fmt(tokens_per_s(r)),
                      fmt(bench_csv.quantile(r["step_ms"], 0.5) if ok else None, 1),
                      fmt(mib("peak_reserved")), fmt(mib("peak_in_use")),
                      fmt(mib("peak_allocated")), fmt(r.get("loss"), 4),
                      (r.get("detail") or "")[:70]])
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(ln, widths)) for ln in lines]
    return "\n".join(out)


def summary(results, models, seqs):
    out = []
    get = {k: r for k, r in results}
    for model in models:
        for seq in seqs:
            a, b = get.get((model, seq, "torch")), get.get((model, seq, "torch+liger-kernel"))
            if a and b and a["status"] == b["status"] == "ok":
                tps = tokens_per_s(b) / tokens_per_s(a)
                mem = (b["peak_reserved"] / a["peak_reserved"]
                       if a.get("peak_reserved") and b.get("peak_reserved") else None)
                out.append(f"{model} seq {seq}: torch+liger-kernel / torch: tokens/s "
                           f"{tps:.2f}x, peak reserved {fmt(mem, 2)}x; losses "
                           f"{fmt(a.get('loss'), 4)} / {fmt(b.get('loss'), 4)}")
    return "\n".join(out)


def main():
    args = parse_args()
    if args.case:
        model, seq, batch, provider = args.case.split(":", 3)
        r = run_case(args, model, int(seq), int(batch), provider)
        print(RESULT_PREFIX + json.dumps(r), flush=True)
        return 0
    seqs = sorted(set(args.seq))
    print(f"anchor e2e: transformers ({args.attn}) training steps = forward + loss + backward "
          f"+ AdamW step, synchronized; {args.warmup} warmup (cache emptied before the last) + "
          f"{args.steps} timed steps per case, batch {args.batch}, {args.dtype}, device "
          f"{args.device}, one process per case (timeout {args.timeout} s)", flush=True)
    run = {"gpu": args.gpu, "commit": args.commit or bench_csv.default_commit(),
           "date": bench_csv.utc_date()}
    started = time.time()
    results = []
    total = len(args.models) * len(seqs) * len(args.providers)
    for model in args.models:
        failed = {}
        for seq in seqs:
            for provider in args.providers:
                left = None if args.budget is None else args.budget - (time.time() - started)
                if provider in failed and not args.no_skip:
                    r = {"status": "skipped", "detail": f"{failed[provider]}"}
                elif left is not None and left < MIN_CASE_SECONDS:
                    r = {"status": "skipped", "detail": "--budget spent"}
                else:
                    timeout = args.timeout if left is None else int(min(args.timeout, left))
                    r = run_child(args, model, seq, provider, timeout)
                    if r["status"] != "ok":
                        failed.setdefault(provider, f"{r['status']} at seq {seq}")
                r.setdefault("tokens", args.batch * seq)
                r.setdefault("step_ms", [])
                if run["gpu"] is None and r.get("device_name"):
                    run["gpu"] = r["device_name"]
                results.append(((model, seq, provider), r))
                what = (f"ok: {fmt(tokens_per_s(r))} tokens/s, peak reserved "
                        f"{fmt(r.get('peak_reserved', 0) / MIB)} MiB, loss {fmt(r.get('loss'), 4)}"
                        if r["status"] == "ok" else f"{r['status']}: {r.get('detail', '')}")
                print(f"[{len(results)}/{total}] {model} seq {seq} {provider}: {what} "
                      f"({r.get('wall_s', 0):.0f} s)", flush=True)
                if args.csv:
                    rows = case_rows(args, model, seq, provider, r)
                    bench_csv.append(args.csv, rows, dict(run, gpu=run["gpu"] or args.device))
    print()
    print(render(results))
    s = summary(results, args.models, seqs)
    if s:
        print()
        print(s)
    if args.csv:
        print(f"csv: rows of {len(results)} cases appended to {args.csv}")
    return 1 if any(r["status"] == "error" for _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
