#!/usr/bin/env python3
"""Goodput under failures (issue #68; docs/failure-model.md, "Goodput under failures").

The share of a fault-free run's training speed that a run keeps while its workers fail at random:
one `loco coordinator` and M `loco worker` processes of an elastic run on this machine (loopback),
each worker killed with SIGKILL at the times of a Poisson process (each live worker fails at the
given mean time between failures, MTBF) and started again, with the command that started it, after
a delay. The same seed gives every method the same draws.

Useful work is the inner steps that reached the run's parameters (metrics.jsonl): in a synchronous
run, each completed round's contributors times the steps since that fragment's last round (a
round that a restart from the checkpoint undid counts for nothing); in an asynchronous one, each
applied outer gradient's steps, its worker's since its last (or its start). The steps of a worker
killed before its outer gradient was applied count for nothing. Goodput = useful steps per second
over the run (its first `start` event to its last `sync`) / the same for the run without faults.
It is also given against the compute that was there: useful steps over the worker-seconds that
were alive (a vacant slot's time, the replacement delay, is not counted against the run).

  bench/goodput-failures.py --out runs/bench-goodput --data data/brown [--mtbf 0,600,180]
      [--methods diloco,streaming,async] [--workers 8] [--steps 800] [--step-s 0.2] [--delay 10]
      [--layers 4 --width 256 --context 128 --batch 8] [--set KEY=VALUE ...]
      [--results bench/results/goodput-failures.json]
  bench/goodput-failures.py --step-s 0 --workers 4 --layers 2 --width 64 --context 64 --batch 4 ...
      real compute at small scale: the final validation loss too (at the tokens each run trained)

A finished run (OUT/NAME/result.json) is kept and skipped, so that an interrupted benchmark
continues where it stopped. Runs are on loopback; no root needed.
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

METHODS = {
    "diloco": [],
    "streaming": ["--sync.algorithm=streaming", "--sync.fragments=4", "--sync.overlap_steps=1"],
    "async": ["--sync.async=true"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(args):
    return f"""# bench/goodput-failures.py: an elastic run of emulated compute
[model]
context = {args.context}
layers = {args.layers}
width = {args.width}
heads = 4
[train]
steps = {args.steps}
batch_size = {args.batch}
threads = 1
log_every = 100
emulated_step_s = {args.step_s}
seed = 1
[eval]
every = 1000000  # emulated compute evaluates nothing
[checkpoint]
keep = 2
[sync]
algorithm = "diloco"
inner_steps = {args.inner}
[cluster]
workers = {args.workers}
elastic = true
"""


class Run:
    """One run: the coordinator, the workers, the faults."""

    def __init__(self, args, name, method, mtbf):
        self.args, self.name, self.mtbf = args, name, mtbf
        self.dir = os.path.abspath(os.path.join(args.out, name))
        self.logs = self.dir + ".logs"
        self.common = ["--config", os.path.abspath(os.path.join(args.out, "goodput.toml")),
                       f"--data.dir={os.path.abspath(args.data)}", f"--run.dir={self.dir}"]
        self.common += METHODS[method] + [f"--{kv}" for kv in args.set]
        self.rng = random.Random(args.seed)
        self.tokens_per_step = args.batch * args.context
        self.faults, self.started, self.other_exits = [], 0, []

    def spawn(self, what, argv):
        log = open(os.path.join(self.logs, f"{what}.log"), "w")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_worker(self, place):
        self.started += 1
        return self.spawn(f"worker-{self.started - 1}",
                          [self.args.loco, "worker", "--coordinator", f"127.0.0.1:{self.port}"] + self.common)

    def next_failure(self, now):
        return now + self.rng.expovariate(1.0 / self.mtbf) if self.mtbf > 0 else float("inf")

    def go(self):
        os.makedirs(self.logs, exist_ok=True)
        self.port = free_port()
        t0 = time.time()
        coordinator = self.spawn("coordinator", [self.args.loco, "coordinator", "--port", str(self.port), "--bind",
                                                 "127.0.0.1"] + self.common)
        time.sleep(1.0)
        M = self.args.workers
        procs = [self.start_worker(p) for p in range(M)]
        fail_at = [self.next_failure(time.time()) for _ in range(M)]
        restart_at = [None] * M
        alive_since = [time.time()] * M
        alive_s = 0.0
        deadline = t0 + self.args.deadline
        while coordinator.poll() is None:
            now = time.time()
            if now > deadline:
                coordinator.kill()
                raise SystemExit(f"bench: {self.name} ran past {self.args.deadline} s; see {self.logs}")
            for p in range(M):
                if procs[p] is not None and procs[p].poll() is not None:  # ended on its own
                    code = procs[p].returncode
                    alive_s += now - alive_since[p]
                    if code != 0 and code != -signal.SIGKILL:
                        self.other_exits.append({"t": round(now - t0, 1), "place": p, "code": code})
                        restart_at[p] = now + self.args.delay
                    procs[p] = None
                if procs[p] is not None and now >= fail_at[p]:
                    procs[p].send_signal(signal.SIGKILL)
                    procs[p].wait()
                    alive_s += now - alive_since[p]
                    procs[p] = None
                    self.faults.append(round(now - t0, 1))
                    restart_at[p] = now + self.args.delay
                if procs[p] is None and restart_at[p] is not None and now >= restart_at[p]:
                    procs[p], restart_at[p], alive_since[p] = self.start_worker(p), None, now
                    fail_at[p] = self.next_failure(now)
            time.sleep(0.05)
        end = time.time()
        for p in range(M):
            if procs[p] is not None:
                try:
                    procs[p].wait(60)
                except subprocess.TimeoutExpired:
                    procs[p].kill()
                    procs[p].wait()
                alive_s += min(end, time.time()) - alive_since[p]
        if coordinator.returncode != 0:
            raise SystemExit(f"bench: {self.name}: the coordinator exited {coordinator.returncode}; see {self.logs}")
        return self.measure(alive_s)

    def measure(self, alive_s):
        events = []
        with open(os.path.join(self.dir, "metrics.jsonl")) as f:
            for line in f:
                events.append(json.loads(line))
        starts = [e["time"] for e in events if e.get("event") == "start"]
        syncs = [e for e in events if e.get("event") == "sync"]
        fragments = max(1, len({e.get("fragment", -1) for e in syncs}))
        # Rounds a restart from the checkpoint undid: round + 1 ... round + undone, in epochs up to `epoch`.
        undone = [(e["round"], e["round"] + e.get("undone", 0), e.get("epoch", 0))
                  for e in events if e.get("event") == "restored_from_checkpoint" and e.get("undone", 0) > 0]
        rounds = {}  # synchronous: round -> (contributors, step) of its standing completion
        for e in events:
            if e.get("event") == "round_complete" and not any(
                    lo < e["round"] <= hi and e.get("epoch", 0) <= ep for lo, hi, ep in undone):
                rounds[e["round"]] = (e["contributors"], e["step"])
        useful = 0
        if rounds:
            # Each contributor's outer gradient holds the steps since its fragment's last round (a
            # fragment's rounds come every `fragments` rounds; DiLoCo's every round).
            for r, (contributors, step) in rounds.items():
                useful += contributors * (step - rounds.get(r - fragments, (0, 0))[1])
        else:
            # Asynchronous: each applied push holds its worker's steps since its last (or its start).
            last = {}
            for e in events:
                slot = json.dumps(e.get("worker"))
                if e.get("event") == "start":
                    last[slot] = e.get("step", 0)
                elif e.get("event") == "sync":
                    before = last.get(slot, e["step"])
                    last[slot] = e["step"]
                    if e.get("rejected", 0) == 0:
                        useful += max(0, e["step"] - before)
        wall = max(e["time"] for e in syncs) - min(starts)
        steps = useful / fragments
        evals = [e for e in events if e.get("event") == "eval" and e.get("val_loss") is not None]
        val_loss = max(evals, key=lambda e: e["step"])["val_loss"] if evals else None
        return {"name": self.name, "mtbf_s": self.mtbf, "faults": len(self.faults), "fault_times_s": self.faults,
                "other_exits": self.other_exits, "workers_started": self.started, "wall_s": round(wall, 2),
                "useful_steps": steps, "steps_per_s": steps / wall, "alive_worker_s": round(alive_s, 1),
                "useful_steps_per_alive_worker_s": steps / alive_s if alive_s > 0 else None,
                "rounds_undone": sum(hi - lo for lo, hi, _ in undone), "val_loss": val_loss,
                "tokens": steps * self.tokens_per_step}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loco", default="build/loco")
    ap.add_argument("--data", default="data/brown")
    ap.add_argument("--out", default="runs/bench-goodput")
    ap.add_argument("--results", default="bench/results/goodput-failures.json")
    ap.add_argument("--methods", default="diloco,streaming,async")
    ap.add_argument("--mtbf", default="0,600,180", help="mean seconds between a worker's failures; 0 = none")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--step-s", type=float, default=0.2, help="emulated compute's seconds a step; 0 = real compute")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--delay", type=float, default=10, help="seconds before a killed worker is started again")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=1800)
    ap.add_argument("--set", action="append", default=[], help="a config override, KEY=VALUE (e.g. train.emulated_step_s=0)")
    args = ap.parse_args()
    args.loco = os.path.abspath(args.loco)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "goodput.toml"), "w") as f:
        f.write(config_text(args))
    results = []
    for method in args.methods.split(","):
        calm = None
        for mtbf in [float(x) for x in args.mtbf.split(",")]:
            name = f"{method}-mtbf{int(mtbf)}"
            done = os.path.join(args.out, name, "result.json")
            if os.path.exists(done):
                r = json.load(open(done))
                print(f"bench: {name} already done")
            else:
                subprocess.run(["rm", "-rf", os.path.join(args.out, name), os.path.join(args.out, name) + ".logs"])
                print(f"bench: {name} ({args.workers} workers, MTBF {mtbf:g} s, replaced after {args.delay:g} s)", flush=True)
                r = Run(args, name, method, mtbf).go()
                r["method"] = method
                json.dump(r, open(done, "w"), indent=1)
            if mtbf == 0:
                calm = r
            elif calm is not None:
                r["goodput"] = r["steps_per_s"] / calm["steps_per_s"]
                if r["useful_steps_per_alive_worker_s"] and calm["useful_steps_per_alive_worker_s"]:
                    r["goodput_of_alive_compute"] = r["useful_steps_per_alive_worker_s"] / calm["useful_steps_per_alive_worker_s"]
            loss = f", val_loss {r['val_loss']:.4f}" if r.get("val_loss") is not None else ""
            print(f"bench: {name}: {r['faults']} faults, {r['useful_steps']:.0f} useful steps in {r['wall_s']:.1f} s{loss}"
                  + (f", goodput {r['goodput']:.3f} ({r.get('goodput_of_alive_compute', float('nan')):.3f} of the compute alive)"
                     if "goodput" in r else ""), flush=True)
            results.append(r)
    summary = {"command": " ".join(sys.argv), "workers": args.workers, "steps": args.steps, "inner_steps": args.inner,
               "emulated_step_s": args.step_s, "model": {"layers": args.layers, "width": args.width, "context": args.context},
               "batch_size": args.batch, "replacement_delay_s": args.delay, "seed": args.seed, "overrides": args.set,
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
               "runs": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    json.dump(summary, open(args.results, "w"), indent=1)
    print(f"bench: {args.results}")


if __name__ == "__main__":
    main()
