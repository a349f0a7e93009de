#!/usr/bin/env python3
"""The step of a training run inside a memory cgroup against its bound.

`zinf bench step` compares a step with its resources in the same run, but it
also trains the resident reference, which needs the whole training state in
RAM. A run whose point is to fit a cgroup far smaller than its state is
measured here instead, against the same bound, in the same session:

  bound = max(NVMe bytes per step / fio's mixed read/write speed on the same
              path, compute + Adam)

* fio (io_uring, O_DIRECT, the config's aio block size, queue depth and
  threads, buffers in huge pages as zinf's) runs on the NVMe path right before and right after the training,
  the one after in the step's read/write mix (the one before, whose mix is
  not known yet, half and half); the bound uses the mean of the two, and both
  are reported (the drives of shared machines change speed within minutes).
* The training runs under `memcap` (../shared/tools/memcap, or --memcap) with
  --metrics; steps after the first are timed; the bytes per step come from
  the run's last progress line.
* compute is the run's own median compute time per step; Adam is `zinf bench
  adam` over 2^26 parameters, scaled to the model's parameter count.

Prints one JSON object (and writes it to --json): the step times, their
median, the bytes, both fio speeds, the bound, ratio_to_bound, the cgroup's
peak and the exact losses. Hand-run (minutes to hours); not part of CI.

  perf/capped_step.py --zinf build/zinf --config C --model M --nvme-path P \\
      --cap 2G --device-budget 640M --steps 6 [--fio-size 8G] [--json OUT]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_size(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", text)
    if not m:
        raise SystemExit(f"capped_step: bad size {text!r} (expected e.g. 8G)")
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)])


class HugePages:
    """2 MiB pages reserved for fio's buffers while fio runs, as `zinf bench
    step` does: zinf's streamed buffers are transparent huge pages, so a 1 MiB
    request is one segment; fio in 4 KiB pages is split at the device's
    max_segments (half the speed on virtio-blk). Needs root; else 4 KiB."""
    PATH = "/proc/sys/vm/nr_hugepages"

    def __init__(self, aio):
        self.want = aio["queue_depth"] * aio["thread_count"] * max(1, aio["block_size"] >> 21) + 4
        self.before = None
        self.active = False

    def __enter__(self):
        try:
            with open(self.PATH) as f:
                self.before = int(f.read())
            with open(self.PATH, "w") as f:
                f.write(str(self.before + self.want))
            with open(self.PATH) as f:
                self.active = int(f.read()) >= self.before + self.want
        except OSError:
            self.active = False
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            try:
                with open(self.PATH, "w") as f:
                    f.write(str(self.before))
            except OSError:
                pass

    def describe(self):
        return f"2 MiB huge pages ({self.want} reserved)" if self.active else "4 KiB pages (no huge pages reserved)"


def aio_settings(config):
    """The config's aio block size, queue depth and threads (DeepSpeed's defaults where unset): fio's job."""
    aio = {"block_size": 1 << 20, "queue_depth": 8, "thread_count": 1}
    aio.update({k: v for k, v in config.get("aio", {}).items() if k in aio})
    return aio


def fio_mixed(path, size, read_percent, aio):
    """fio's mixed sequential read/write speed (bytes/s) on a file in `path`,
    and how its buffers were backed."""
    fd, name = tempfile.mkstemp(prefix="capped-step-fio.", dir=path)
    os.close(fd)
    try:
        cmd = ["fio", "--name=capped-step", "--output-format=json", "--thread", "--group_reporting",
               f"--filename={name}", "--rw=rw", f"--rwmixread={read_percent}", "--ioengine=io_uring",
               "--direct=1", "--fixedbufs", "--registerfiles", f"--bs={aio['block_size']}",
               f"--iodepth={aio['queue_depth']}", f"--iodepth_batch_submit={aio['queue_depth']}",
               "--iodepth_batch_complete_min=1", f"--numjobs={aio['thread_count']}",
               f"--size={size // aio['thread_count']}", f"--offset_increment={size // aio['thread_count']}"]
        with HugePages(aio) as pages:
            if pages.active:
                cmd.append("--iomem=shmhuge")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        job = json.loads(out[out.index("{"):])["jobs"][0]
        return job["read"]["bw_bytes"] + job["write"]["bw_bytes"], pages.describe()
    finally:
        os.unlink(name)


def step_bytes(log):
    """NVMe bytes per step (read, written) from the run's last progress line."""
    lines = [l for l in log.splitlines() if "moved: nvme r" in l]
    if not lines:
        raise SystemExit("capped_step: the run printed no progress line with the bytes it moved")
    size = r"([\d.]+) (B|KiB|MiB|GiB|TiB)"
    m = re.search(rf"nvme r {size} w {size}, optim {size}, grad {size}", lines[-1])
    if not m:
        raise SystemExit("capped_step: cannot read the bytes in: " + lines[-1])
    v = [float(m.group(i)) * UNITS[m.group(i + 1)] for i in (1, 3, 5, 7)]
    param_r, param_w, optim, grad = v
    # The optimizer reads and writes master, m and v alike; the gradient is
    # written under the backward and read by the update.
    return param_r + optim / 2 + grad / 2, param_w + optim / 2 + grad / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zinf", default="build/zinf")
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--nvme-path", required=True)
    ap.add_argument("--cap", default="2G")
    ap.add_argument("--device-budget", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--fio-size", default="8G")
    ap.add_argument("--memcap", default=os.path.join(os.path.dirname(__file__), "../../shared/tools/memcap"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.steps < 3:
        raise SystemExit("capped_step: --steps must be >= 3 (the first step is a warm-up)")
    with open(a.config) as f:
        config = json.load(f)
    aio = aio_settings(config)
    fio_size = parse_size(a.fio_size)
    os.makedirs(a.nvme_path, exist_ok=True)

    print("capped_step: fio before the run ...", file=sys.stderr)
    fio_before, fio_pages = fio_mixed(a.nvme_path, fio_size, 50, aio)
    metrics = os.path.join(a.nvme_path, "capped-step-metrics.jsonl")
    run_dir = tempfile.mkdtemp(prefix="capped-step-run.", dir=a.nvme_path)
    cmd = [a.memcap, a.cap, a.zinf, "train", "--config", a.config, "--model", a.model, "--steps", str(a.steps),
           "--nvme-path", run_dir, "--device", "host", "--device-budget", a.device_budget, "--eval-every", "0",
           "--exact-losses", "--metrics", metrics]
    print("capped_step: " + " ".join(cmd), file=sys.stderr)
    run = subprocess.run(cmd, capture_output=True, text=True)
    subprocess.run(["rm", "-rf", run_dir], check=False)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        sys.stderr.write(log[-4000:])
        raise SystemExit(f"capped_step: the training failed (exit {run.returncode})")
    peak = re.search(r"memcap: peak (\d+) bytes of (\d+)", log)
    losses = [float(x) for x in re.findall(r"exact loss (\S+)", log)]
    with open(metrics) as f:
        rows = [json.loads(l) for l in f if '"time"' in l]
    os.unlink(metrics)
    timed = rows[1:]  # the first step is a warm-up
    step_s = [r["time"]["total"] for r in timed]
    compute_s = statistics.median(r["time"]["compute"] for r in timed)
    read_b, write_b = step_bytes(log)
    read_percent = round(100 * read_b / (read_b + write_b))

    print("capped_step: fio after the run ...", file=sys.stderr)
    fio_after, _ = fio_mixed(a.nvme_path, fio_size, read_percent, aio)
    adam = subprocess.run([a.zinf, "bench", "adam", "--params", str(1 << 26), "--runs", "5"], check=True,
                          capture_output=True, text=True).stdout
    adam_gps = json.loads(adam[adam.index("{"):])["gparams_per_s"]
    params = re.search(r"zinf train: model .*?: ([\d.]+)([KMGT]?) parameters", log)
    if not params:
        raise SystemExit("capped_step: the run did not print its parameter count")
    count = float(params.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[params.group(2)]
    adam_s = count / (adam_gps * 1e9)

    fio = (fio_before + fio_after) / 2
    nvme_s = (read_b + write_b) / fio
    cpu_s = compute_s + adam_s
    bound = max(nvme_s, cpu_s)
    median = statistics.median(step_s)
    result = {
        "bench": "capped_step",
        "model": a.model, "config": a.config, "cap": a.cap, "device_budget": a.device_budget,
        "steps_timed": len(step_s), "step_s": step_s, "median_step_s": median,
        "nvme_read_bytes_per_step": read_b, "nvme_write_bytes_per_step": write_b, "read_percent": read_percent,
        "fio": {"before_gbps": fio_before / 1e9, "after_gbps": fio_after / 1e9, "mean_gbps": fio / 1e9,
                "block_size": aio["block_size"], "queue_depth": aio["queue_depth"], "threads": aio["thread_count"],
                "buffers": fio_pages},
        "nvme_s": nvme_s, "compute_s": compute_s, "adam_s": adam_s, "cpu_s": cpu_s,
        "bound_s": bound, "bound_by": "nvme" if nvme_s >= cpu_s else "cpu",
        "ratio_to_bound": median / bound,
        "peak_bytes": int(peak.group(1)) if peak else None, "cap_bytes": int(peak.group(2)) if peak else None,
        "exact_losses": losses,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
