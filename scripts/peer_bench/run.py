"""Interleaved rounds of zero-rs and its PyTorch peer on the same GPT-2 shape, batch and
precision; prints the ratios (PyTorch step time / zero-rs step time: above 1, zero-rs is
faster) as medians over the rounds. Started by scripts/peer-bench.sh, which makes the
virtual environment; see its --help.

Cases, for each shape and precision:
    2 ranks x 1 thread: zero-rs stage 0/1/2/3 vs DDP / ZeroRedundancyOptimizer /
        FSDP2 without resharding after forward (ZeRO-2-like) / FSDP2 (ZeRO-3-like)
    1 rank x K threads: zero-rs vs one PyTorch process with K intra-op threads
Each round runs every case once, zero-rs and PyTorch back to back, in an order that
alternates between rounds, so that a machine's slow minutes fall on both.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    # name: (vocab, layers, heads, width, seq_len, micro_batch); issue 13's two shapes.
    "v4096": (4096, 6, 6, 384, 256, 4),
    "v50257": (50257, 6, 6, 384, 256, 4),
    # GPT-2 124M itself, at its context (1024 tokens a step, as the shapes above): its
    # widths (768, 3072) are what real models look like, unlike the 384 above.
    "gpt2": (50257, 12, 12, 768, 1024, 1),
    # For a quick look (--quick): seconds per case.
    "mini": (1024, 2, 4, 128, 128, 4),
}
PEER_MODE = {0: "ddp", 1: "zero1", 2: "fsdp2-grad", 3: "fsdp2"}
REPO = Path(__file__).resolve().parents[2]


def fail(msg):
    print(f"peer-bench: {msg}", file=sys.stderr)
    sys.exit(1)


def cpu_has_bf16():
    """Whether the CPU has a bf16 dot-product instruction (what oneDNN's bf16 path needs);
    True where /proc/cpuinfo cannot tell (not Linux), so nothing is claimed there."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def run(cmd, what, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        fail(f"{what} failed (exit {p.returncode}); command: {' '.join(map(str, cmd))}\n{tail}")
    return p.stdout, time.time() - t0


def config_for(shape, out):
    v, l, h, c, t, b = SHAPES[shape]
    path = out / f"{shape}.toml"
    path.write_text(
        f"""# written by scripts/peer_bench/run.py: the peer benchmark's shape '{shape}'
[model]
vocab_size = {v}
context_len = {t}
layers = {l}
heads = {h}
width = {c}

[data]
path = "builtin"

[train]
micro_batch = {b}
seq_len = {t}
grad_accum = 1
log_every = 1000

[optim]
lr = 3e-4
"""
    )
    return path


def ours(args, shape, precision, ranks, stage, threads, tag):
    cfg = config_for(shape, args.out)
    metrics = args.out / f"ours-{tag}.jsonl"
    metrics.unlink(missing_ok=True)
    # One rank runs without mpirun: mpirun binds a rank to one core by default, which
    # would put a rank's threads on one core.
    launch = [str(REPO / "scripts/mpirun.sh"), str(ranks)] if ranks > 1 else []
    cmd = launch + [
        str(args.zero_bench), "train", "--config", str(cfg), "--stage", str(stage), "--precision", precision,
        "--threads", str(threads), "--steps", str(args.steps), "--metrics", str(metrics),
    ]
    env = dict(os.environ, RUST_LOG="warn")
    run(cmd, f"zero-rs ({tag})", env)
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [s["step_seconds"] for s in steps][args.warmup:]
    if not times:
        fail(f"zero-rs ({tag}) wrote no step after the {args.warmup} warm-up steps")
    return statistics.median(times)


def peer(args, shape, precision, ranks, mode, threads, tag):
    v, l, h, c, t, b = SHAPES[shape]
    script = REPO / "scripts/peer_bench/torch_gpt.py"
    common = [
        str(script), "--mode", mode, "--precision", precision, "--vocab", str(v),
        "--layers", str(l), "--heads", str(h), "--width", str(c), "--seq-len", str(t),
        "--micro-batch", str(b), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(threads),
    ]
    if ranks == 1:
        cmd = [args.python] + common
    else:
        cmd = [args.python, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}"] + common
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out, _ = run(cmd, f"PyTorch ({tag})", env)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        fail(f"PyTorch ({tag}) printed no result:\n{out[-2000:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--python", required=True, help="the venv's python, with torch")
    ap.add_argument("--zero-bench", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder for configs and results")
    ap.add_argument("--shapes", default="v4096,v50257", help=f"of {','.join(SHAPES)}")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--stages", default="0,1,2,3", help="2-rank cases")
    ap.add_argument("--threads", default="1,2", help="1-rank cases: threads per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for s in args.shapes.split(","):
        if s not in SHAPES:
            fail(f"unknown shape '{s}'; known: {', '.join(SHAPES)}")
    if args.steps <= args.warmup:
        fail(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if "bf16" in args.precisions.split(",") and not cpu_has_bf16():
        print("peer-bench: this CPU has no bf16 instruction (no avx512_bf16 or amx_bf16 in "
              "/proc/cpuinfo), so PyTorch's bf16 autocast takes a slow path: on a Zen 2 core "
              "its steps took 18 s at v4096 and 220 s at v50257 (zero-rs: 1.2 and 2.6 s). "
              "Consider --precisions fp32, or fewer --steps/--rounds for bf16.",
              file=sys.stderr, flush=True)

    cases = []
    for shape in args.shapes.split(","):
        for precision in args.precisions.split(","):
            for stage in [int(s) for s in args.stages.split(",") if s]:
                cases.append((shape, precision, 2, stage, PEER_MODE[stage], 1))
            for k in [int(k) for k in args.threads.split(",") if k]:
                cases.append((shape, precision, 1, 0, "single", k))

    results = {c: {"ours": [], "peer": []} for c in cases}
    torch_version = None
    for r in range(args.rounds):
        for i, case in enumerate(cases):
            shape, precision, ranks, stage, mode, threads = case
            tag = f"{shape}-{precision}-{ranks}r{threads}t-s{stage}"
            jobs = [
                ("ours", lambda: ours(args, shape, precision, ranks, stage, threads, tag)),
                ("peer", lambda: peer(args, shape, precision, ranks, mode, threads, tag)),
            ]
            if (r + i) % 2:
                jobs.reverse()
            for who, job in jobs:
                value = job()
                if who == "peer":
                    torch_version = value["torch"]
                    value = value["step_seconds"]
                results[case][who].append(value)
            o, p = results[case]["ours"][-1], results[case]["peer"][-1]
            print(f"round {r + 1}/{args.rounds} {tag}: zero-rs {o:.3f} s, "
                  f"PyTorch {mode} {p:.3f} s, ratio {p / o:.2f}", flush=True)

    print(f"\nPyTorch {torch_version} / zero-rs step time, median of {args.rounds} rounds "
          f"(above 1: zero-rs faster); {args.steps} steps, first {args.warmup} left out")
    print("| shape | precision | ranks x threads | zero-rs | PyTorch peer | zero-rs s/step "
          "| PyTorch s/step | ratio (rounds) |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for case, res in results.items():
        shape, precision, ranks, stage, mode, threads = case
        ratios = [p / o for o, p in zip(res["ours"], res["peer"])]
        row = {
            "shape": shape, "precision": precision, "ranks": ranks, "threads": threads,
            "stage": stage, "peer": mode, "ours_s": statistics.median(res["ours"]),
            "peer_s": statistics.median(res["peer"]), "ratio": statistics.median(ratios),
            "ratios": ratios,
        }
        table.append(row)
        print(f"| {shape} | {precision} | {ranks} x {threads} | stage {stage} | {mode} | "
              f"{row['ours_s']:.3f} | {row['peer_s']:.3f} | **{row['ratio']:.2f}** "
              f"({', '.join(f'{x:.2f}' for x in ratios)}) |")
    (args.out / "peer-bench.json").write_text(json.dumps(
        {"torch": torch_version, "rounds": args.rounds, "steps": args.steps,
         "warmup": args.warmup, "rows": table}, indent=1))
    print(f"\nresults: {args.out / 'peer-bench.json'}")


if __name__ == "__main__":
    main()
