#!/usr/bin/env python3
"""zinf on one GPU against transformers + torch AdamW, DeepSpeed ZeRO-Infinity
and a resident PyTorch run: the same weights, batches and DeepSpeed JSON.

Hand-run on a machine with a GPU, PyTorch and transformers (DeepSpeed for its
run); not part of CI. Every run trains from the same Hugging Face folder on
the same token file, batches in file order (llm.c's convention: a micro-batch
is B*T+1 consecutive tokens, inputs the first B*T, targets shifted by one, the
next B*T later), one micro-batch per step, a constant learning rate.

  make-model  a random-init HF folder (seeded, F32 safetensors) of a named shape:
              gpt2-124m (GPT2LMHeadModel) or llama-1b (LlamaForCausalLM,
              TinyLlama's shape: 1.1B parameters, GQA 32/4, SwiGLU, untied head),
              and a token file of bytes (ids 0-255, end-of-text 256) encoded by
              `zinf data encode` (run by compare) from the Python library's sources
  run         one trainer in its own process (GPU memory back at its end):
              zinf (`zinf train --metrics`), torch (the model on the GPU, torch's
              AdamW and clip_grad_norm_, fp32 with TF32 off, or bf16 autocast
              with --bf16), deepspeed (deepspeed.initialize with the JSON)
  table       the README's table rows from compare's JSON files
  plot        an SVG of the losses of one compare JSON
  curve       zinf twice on one model and config, --gpu-compute 16 and fp32 (on a GPU
              with bf16 on: tensor-core bf16 matmuls against the fp32 path), and
              the losses' largest and mean difference; the JSON plots like
              compare's (the host device computes fp32 in both: a dry run)
  compare     runs several trainers on one folder and prints one JSON object:
              per trainer the losses, step times, tokens/s (median over steps
              after the first two), GPU busy (NVML's utilization, sampled every
              50 ms over the timed steps: the share of time a kernel ran) and,
              for zinf, the step's time parts from its metrics; the largest
              loss difference of each trainer to the first one. Trainer
              zinf-timed is zinf with wall_clock_breakdown: also its kernels'
              busy share of the step by CUDA events and each Ops method's
              median seconds a step.

  perf/gpu_compare.py curve --zinf perf/gpu/zinf-gpu --model demo --config configs/cpu-offload.json \
      --steps 200 --json OUT
  perf/gpu_compare.py make-model --shape llama-1b --dir /tmp/m
  perf/gpu_compare.py compare --zinf perf/gpu/zinf-gpu --model /tmp/m --config C.json \\
      --trainers zinf,torch --steps 20 --device-budget-fraction 0.333 --json OUT
"""
import argparse
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import capped_step  # noqa: E402  fio's mixed speed and the bytes of zinf's progress lines

SHAPES = {
    "gpt2-124m": dict(arch="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257),
    "llama-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                     max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False),
    # For trying the script itself on a machine without a GPU.
    "llama-tiny": dict(arch="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=320,
                       max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False),
}


def make_model(a):
    import torch
    import transformers

    s = dict(SHAPES[a.shape])
    arch = s.pop("arch")
    torch.manual_seed(a.seed)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(**s)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(**s)
        model = transformers.LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(a.dir, safe_serialization=True)
    # Text: the Python library's own sources, enough for every step's window.
    need = a.tokens
    text_path = os.path.join(a.dir, "corpus.txt")
    with open(text_path, "wb") as out:
        got = 0
        for f in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
            with open(f, "rb") as src:
                b = src.read()
            out.write(b)
            got += len(b)
            if got >= need:
                break
    print(json.dumps({"shape": a.shape, "params": n, "dir": a.dir}))


def encode_corpus(zinf, model_dir):
    """tokens.bin beside corpus.txt, from `zinf data encode` (byte tokenizer)."""
    path = os.path.join(model_dir, "tokens.bin")
    if not os.path.exists(path):
        subprocess.run([zinf, "data", "encode", "--input", os.path.join(model_dir, "corpus.txt"), "--output", path],
                       check=True)
    return path


def read_tokens(path):
    import numpy as np

    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520:
        raise SystemExit(f"gpu_compare: {path} is not a token file")
    dtype = np.uint16 if header[1] == 1 else np.uint32
    return np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2])).astype(np.int64)


def batches(tokens, b, t, steps):
    """Step i's inputs and targets: B*T+1 tokens from i*B*T, wrapping at the end."""
    import numpy as np

    n = len(tokens)
    for i in range(steps):
        start = (i * b * t) % n
        idx = (np.arange(b * t + 1) + start) % n
        w = tokens[idx]
        yield w[:-1].reshape(b, t), w[1:].reshape(b, t)


def emit(out, rec):
    rec["wall"] = time.time()
    out.write(json.dumps(rec) + "\n")
    out.flush()


def lm_loss(logits, targets):
    """Mean cross-entropy over every position, in fp32 (zinf's loss)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run_torch(a, cfg, out):
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(dev)
    o = cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))),
                            eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.0),
                            fused=a.bf16)
    clip = cfg.get("gradient_clipping", 0.0)
    b, t = cfg["train_micro_batch_size_per_gpu"], a.seq_len
    for i, (x, y) in enumerate(batches(read_tokens(a.data), b, t, a.steps), 1):
        x, y = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(input_ids=x).logits
        loss = lm_loss(logits, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        emit(out, {"step": i, "loss": loss.item(), "grad_norm": norm.item()})


def run_deepspeed(a, cfg, out):
    import torch
    import transformers

    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                 ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    # DeepSpeed's op builder reads TORCH_CUDA_ARCH_LIST as numbers and fails
    # on arch-specific entries such as "9.0a" (the GPU machine's image sets
    # one); its JIT-built ops (CPU Adam, async I/O) take the GPU's own.
    if torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "%d.%d" % torch.cuda.get_device_capability()
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    zo = cfg.get("zero_optimization", {})
    for key in ("offload_param", "offload_optimizer"):
        if a.nvme_path and zo.get(key, {}).get("device") == "nvme":
            zo[key]["nvme_path"] = a.nvme_path
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    dev = engine.device
    b, t = cfg["train_micro_batch_size_per_gpu"], a.seq_len
    for i, (x, y) in enumerate(batches(read_tokens(a.data), b, t, a.steps), 1):
        x, y = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
        logits = engine(input_ids=x).logits
        loss = lm_loss(logits, y)
        engine.backward(loss)
        engine.step()
        get_accelerator().synchronize()
        emit(out, {"step": i, "loss": loss.item(), "grad_norm": float(engine.get_global_grad_norm() or 0.0)})


def run_one(a):
    with open(a.config) as f:
        cfg = json.load(f)
    with open(a.out, "a") as out:
        {"torch": run_torch, "deepspeed": run_deepspeed}[a.trainer](a, cfg, out)


class GpuSampler:
    """NVML's GPU utilization (the share of the last sample period in which a
    kernel ran) every 50 ms, with the wall time of each sample."""

    def __init__(self):
        self.samples = []
        self.stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self.handle)
        except Exception as e:  # no NVML: GPU busy is reported as unknown
            print(f"gpu_compare: no NVML ({e}); GPU busy not measured", file=sys.stderr)
            self.nvml = None
            self.name = None
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while self.nvml and not self.stop.wait(0.05):
            u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            self.samples.append((time.time(), u.gpu))

    def busy(self, t0, t1):
        s = [u for (t, u) in self.samples if t0 <= t <= t1]
        return statistics.mean(s) / 100.0 if s else None


def zinf_command(a, cfg_path, metrics, budget):
    cmd = [a.zinf, "train", "--config", cfg_path, "--model", a.model, "--data", a.data, "--steps",
           str(a.steps), "--data-order", "sequential", "--holdout", "0", "--weight-decay-on", "all", "--metrics",
           metrics, "--seq-len", str(a.seq_len), "--device", "auto"]
    if budget:
        cmd += ["--device-budget", str(budget)]
    if a.nvme_path and uses_nvme(a.cfg):
        cmd += ["--nvme-path", a.nvme_path]
    return cmd + a.zinf_args


class TrainerFailed(Exception):
    pass


def run_trainer(a, name, work, params):
    """Runs one trainer; returns its per-step records (step, loss, wall, ...)."""
    lines_path = os.path.join(work, f"{name}.jsonl")
    if name in ("zinf", "zinf-timed"):
        budget = int(16 * params * a.device_budget_fraction) if a.device_budget_fraction else 0
        cmd = zinf_command(a, a.config if name == "zinf" else a.timed_config, lines_path, budget)
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "run", "--trainer", name.split("-")[0], "--model",
               a.model, "--data", a.data, "--config", a.config, "--steps", str(a.steps), "--seq-len",
               str(a.seq_len), "--out", lines_path] + (["--bf16"] if name == "torch-bf16" else []) + \
              (["--nvme-path", a.nvme_path] if a.nvme_path else [])
    print(f"gpu_compare: {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    log_path = os.path.join(work, f"{name}.log")
    recs, seen = [], 0
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            done = p.poll() is not None
            if os.path.exists(lines_path):
                with open(lines_path) as f:
                    lines = f.read().splitlines()
                for line in lines[seen:]:
                    r = json.loads(line)
                    if "loss" in r:
                        r.setdefault("wall", time.time())  # zinf's lines: when they appeared
                        recs.append(r)
                seen = len(lines)
            if done:
                break
            time.sleep(0.02)
    if p.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise TrainerFailed(f"{name} exited {p.returncode}:\n{tail}")
    return recs, log_path


def uses_nvme(cfg):
    zo = cfg.get("zero_optimization", {})
    return any(zo.get(k, {}).get("device") == "nvme" for k in ("offload_param", "offload_optimizer"))


def table(a):
    """The README's rows from compare's JSON files."""
    print("| model | param/optim | GPU | zinf tok/s | DeepSpeed tok/s | zinf/DeepSpeed | GPU busy |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in a.files:
        with open(path) as f:
            r = json.load(f)
        zo = r["config"].get("zero_optimization", {})
        tiers = "/".join(zo.get(k, {}).get("device", "none") for k in ("offload_param", "offload_optimizer"))
        z, d = r["trainers"].get("zinf", {}), r["trainers"].get("deepspeed", {})
        zt, dt = z.get("tokens_per_s"), d.get("tokens_per_s")
        if not zt:  # zinf did not run or failed: no row
            continue
        gpu = (r.get("gpu") or "?").replace("NVIDIA ", "")
        # GPU busy: by CUDA events where the row ran zinf-timed, else NVML's sampled utilization.
        busy = r["trainers"].get("zinf-timed", {}).get("gpu_busy_events", z.get("gpu_busy"))
        print(f"| {os.path.basename(r['model'].rstrip('/'))} | {tiers} | {gpu} | {zt:,.0f} | "
              + (f"{dt:,.0f} | {zt / dt:.2f}x" if dt else "failed | -") + " | "
              + (f"{busy:.0%}" if busy is not None else "-") + " |")


def plot(a):
    """An SVG of every trainer's losses in one compare JSON (no plotting library needed)."""
    with open(a.file) as f:
        r = json.load(f)
    curves = {k: v["losses"] for k, v in r["trainers"].items() if v.get("losses")}
    w, h, pad = 640, 360, 48
    n = max(len(c) for c in curves.values())
    lo, hi = min(min(c) for c in curves.values()), max(max(c) for c in curves.values())
    x = lambda i: pad + (w - 2 * pad) * i / max(1, n - 1)
    y = lambda v: h - pad - (h - 2 * pad) * (v - lo) / max(1e-9, hi - lo)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{pad}" y="20">{a.title or os.path.basename(a.file)}: training loss per step</text>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">step (1 to {n})</text>']
    for v in (lo, (lo + hi) / 2, hi):
        svg.append(f'<text x="{pad - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for k, (name, c) in enumerate(curves.items()):
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(c))
        col = colors[k % len(colors)]
        svg.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{pts}"/>')
        svg.append(f'<text x="{w - pad - 110}" y="{pad + 16 * k}" fill="{col}">{name}</text>')
    svg.append("</svg>")
    with open(a.svg, "w") as f:
        f.write("\n".join(svg) + "\n")


def count_params(model_dir):
    from safetensors import safe_open

    n = 0
    for f in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with safe_open(f, "np") as s:
            n += sum(math.prod(s.get_slice(k).get_shape()) for k in s.keys())
    return n


def summarize(name, recs, sampler, tokens_per_step, params):
    walls = [r["wall"] for r in recs]
    steps = [w1 - w0 for w0, w1 in zip(walls, walls[1:])][1:]  # after the first two steps
    med = statistics.median(steps) if steps else None
    out = {"losses": [r["loss"] for r in recs], "step_seconds": steps, "median_step_seconds": med,
           "tokens_per_s": tokens_per_step / med if med else None,
           "model_tflops": 6 * params * tokens_per_step / med / 1e12 if med else None,
           "gpu_busy": sampler.busy(walls[2], walls[-1]) if len(walls) > 3 else None}
    if name.startswith("zinf"):
        parts = {}
        for r in recs[2:]:
            for k, v in r.get("time", {}).items():
                parts.setdefault(k, []).append(v)
        out["time_parts_median"] = {k: statistics.median(v) for k, v in parts.items()}
    timed = [r for r in recs[2:] if "kernels" in r]
    if timed:  # zinf-timed: the kernels' time on the GPU by its own clock (CUDA events), per step
        out["gpu_busy_events"] = statistics.median(r["kernels"]["busy"] / r["time"]["total"] for r in timed)
        ops = {}
        for r in timed:
            for op, t in r["kernels"]["ops"].items():
                ops.setdefault(op, []).append(t["seconds"])
        out["kernel_seconds_median"] = dict(sorted(((op, statistics.median(v)) for op, v in ops.items()),
                                                   key=lambda kv: -kv[1]))
    return out


def compare(a):
    with open(a.config) as f:
        cfg = json.load(f)
    if a.micro_batch:
        cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
    work = a.work or tempfile.mkdtemp(prefix="gpu-compare.")
    os.makedirs(work, exist_ok=True)
    a.config = os.path.join(work, "config.json")  # the one JSON every trainer reads
    with open(a.config, "w") as f:
        json.dump(cfg, f, indent=1)
    a.timed_config = os.path.join(work, "config-timed.json")  # zinf-timed's: the same with wall_clock_breakdown
    with open(a.timed_config, "w") as f:
        json.dump(dict(cfg, wall_clock_breakdown=True), f, indent=1)
    if a.data is None:
        a.data = encode_corpus(a.zinf, a.model)
    params = count_params(a.model)
    tokens_per_step = cfg["train_micro_batch_size_per_gpu"] * cfg.get("gradient_accumulation_steps", 1) * a.seq_len
    sampler = GpuSampler()

    def write(result):  # after every trainer: a later one may not finish in the machine's time
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    result = {"gpu": sampler.name,"model": a.model, "params": params, "config": cfg, "steps": a.steps, "seq_len": a.seq_len,
              "tokens_per_step": tokens_per_step, "device_budget_fraction": a.device_budget_fraction,
              "trainers": {}}
    a.cfg = cfg
    nvme = uses_nvme(cfg)
    aio = capped_step.aio_settings(cfg)
    if nvme and not a.nvme_path:
        raise SystemExit("gpu_compare: an NVMe config needs --nvme-path")
    for name in a.trainers.split(","):
        t0 = time.time()
        if nvme:
            os.makedirs(a.nvme_path, exist_ok=True)
            for entry in os.scandir(a.nvme_path):  # the last trainer's swap files
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        fio_before = capped_step.fio_mixed(a.nvme_path, 4 << 30, 50, aio)[0] if nvme and name == "zinf" else None
        try:
            recs, log = run_trainer(a, name, work, params)
        except TrainerFailed as e:
            print(f"gpu_compare: {e}", file=sys.stderr, flush=True)
            result["trainers"][name] = {"error": str(e)[-2000:]}
            write(result)
            continue
        r = summarize(name, recs, sampler, tokens_per_step, params)
        if fio_before:
            # The step's NVMe bound: its bytes at fio's mixed speed in its read share (mean of before and after).
            with open(log) as f:
                read_b, write_b = capped_step.step_bytes(f.read())
            share = round(100 * read_b / (read_b + write_b))
            fio_after = capped_step.fio_mixed(a.nvme_path, 4 << 30, share, aio)[0]
            bound = (read_b + write_b) / ((fio_before + fio_after) / 2)
            r["nvme_bound"] = {"read_bytes": read_b, "write_bytes": write_b, "fio_before_gbps": fio_before / 1e9,
                               "fio_after_gbps": fio_after / 1e9, "bound_s": bound,
                               "ratio_to_bound": r["median_step_seconds"] / bound}
        r["wall_seconds"] = time.time() - t0
        r["log"] = log
        result["trainers"][name] = r
        first = next(v for v in result["trainers"].values() if "losses" in v)
        n = min(len(first["losses"]), len(r["losses"]))
        r["max_abs_loss_diff_to_first"] = max(abs(x - y) for x, y in zip(first["losses"][:n], r["losses"][:n]))
        print(f"gpu_compare: {name}: {r['tokens_per_s']} tok/s, busy {r['gpu_busy']}, "
              f"max |dloss| {r['max_abs_loss_diff_to_first']:.3g}", file=sys.stderr, flush=True)
        write(result)
    sampler.stop.set()
    print(json.dumps(result))


def curve(a):
    """The 16-bit compute mode's losses against the fp32 path's, step by step."""
    work = a.work or tempfile.mkdtemp(prefix="gpu-curve.")
    os.makedirs(work, exist_ok=True)
    sampler = GpuSampler()  # for the GPU's name
    sampler.stop.set()
    result = {"gpu": sampler.name, "model": a.model, "config": a.config, "steps": a.steps, "trainers": {}}
    for mode in ("16", "fp32"):
        metrics = os.path.join(work, f"zinf-{mode}.jsonl")
        cmd = [a.zinf, "train", "--config", a.config, "--model", a.model, "--steps", str(a.steps), "--eval-every",
               "0", "--gpu-compute", mode, "--metrics", metrics, "--device", "auto"] + a.zinf_args
        print(f"gpu_compare: {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"gpu_compare: zinf --gpu-compute {mode} exited {p.returncode}:\n{p.stderr[-3000:]}")
        with open(metrics) as f:
            recs = [json.loads(line) for line in f if '"loss"' in line]
        compute = next((line.split("compute ", 1)[1].split(":")[0] for line in p.stderr.splitlines()
                        if line.startswith("zinf train: compute ")), "?")
        result["trainers"][f"zinf-{mode}"] = {"compute": compute, "losses": [r["loss"] for r in recs],
                                             "wall_seconds": time.time() - t0}
    l16, l32 = (result["trainers"][k]["losses"] for k in ("zinf-16", "zinf-fp32"))
    diffs = [abs(x - y) for x, y in zip(l16, l32)]
    result["max_abs_loss_diff"] = max(diffs)
    result["mean_abs_loss_diff"] = sum(diffs) / len(diffs)
    result["last_losses"] = {"16": l16[-1], "fp32": l32[-1]}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "trainers"}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--dir", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--tokens", type=int, default=2_000_000, help="bytes of text to encode")
    r = sub.add_parser("run")
    r.add_argument("--trainer", choices=["torch", "deepspeed"], required=True)
    for p in (r, sub.add_parser("compare")):
        p.add_argument("--model", required=True)
        p.add_argument("--data")
        p.add_argument("--config", required=True)
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--seq-len", type=int, default=1024)
        p.add_argument("--nvme-path")
    r.add_argument("--out", required=True)
    r.add_argument("--bf16", action="store_true")
    c = sub.choices["compare"]
    c.add_argument("--zinf", default="build/zinf")
    c.add_argument("--trainers", default="zinf,torch",
                   help="zinf, zinf-timed (zinf with wall_clock_breakdown: its kernels' GPU time by CUDA events), "
                        "torch, torch-bf16, deepspeed")
    c.add_argument("--device-budget-fraction", type=float, default=0.0,
                   help="zinf's --device-budget as this fraction of 16 B/param (0: no cap)")
    c.add_argument("--work")
    c.add_argument("--micro-batch", type=int, help="train_micro_batch_size_per_gpu for every trainer")
    c.add_argument("--json")
    c.add_argument("zinf_args", nargs="*", help="after --: more arguments for zinf train")
    cv = sub.add_parser("curve")
    cv.add_argument("--zinf", default="build/zinf")
    cv.add_argument("--model", default="demo")
    cv.add_argument("--config", required=True)
    cv.add_argument("--steps", type=int, default=200)
    cv.add_argument("--work")
    cv.add_argument("--json")
    cv.add_argument("zinf_args", nargs="*", help="after --: more arguments for zinf train")
    pl = sub.add_parser("plot")
    pl.add_argument("file")
    pl.add_argument("--svg", required=True)
    pl.add_argument("--title")
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    a = ap.parse_args()
    {"make-model": make_model, "run": run_one, "compare": compare, "curve": curve, "table": table,
     "plot": plot}[a.cmd](a)


if __name__ == "__main__":
    main()
