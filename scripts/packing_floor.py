#!/usr/bin/env python3
"""How few GPUs could any placement leave unallocated? A packing floor for the fill experiment.

For each openb trace and seed this takes the pods that have arrived when GPU demand reaches
100 % of the cluster's capacity (the trace's GPU pods shuffled with the seed, then redrawn
with replacement, as the fill protocol inflates them) and reports the unallocated GPU % of:

- the LP floor: the optimum of the cutting-stock LP (Gilmore-Gomory patterns, solved by
  column generation) over 6,212 GPUs of 1,000 milli, where a k-GPU pod is k whole GPUs.
  It drops CPU, memory, GPU models, node boundaries and arrival order, and may leave any
  pod out, so no policy, online or offline, can leave fewer GPUs unallocated: a true floor.
- best-fit decreasing on the same relaxation (all pods known up front, largest first):
  a good offline packing, not an optimal one, so not a floor; what a policy that sees
  one pod at a time would do well to come near.

What neither sees is what the fill protocol adds: pods arrive in random order and each is
placed, if it fits anywhere, before the next is seen; CPU and GPU models constrain nodes.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install scipy
    /tmp/venv/bin/python scripts/packing_floor.py [--seeds 42,43,44] [TRACE ...]

Reads ../shared/data/openb (or $OPENB_DIR). Seed streams differ from the simulator's, so
compare means over seeds, not single seeds.
"""

import argparse
import bisect
import csv
import os
import random
import sys
from collections import Counter

TRACES = [
    "cpu050", "cpu100", "cpu200", "cpu250", "default", "gpushare100", "gpushare40",
    "gpushare60", "gpushare80", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
]
GPU_MILLI = 1000
# Every gpu_milli in the openb traces is a multiple of 10: the knapsack works in tens.
UNIT = 10


def openb_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("OPENB_DIR", os.path.join(here, "..", "..", "shared", "data", "openb"))


def gpu_count(d):
    with open(os.path.join(d, "openb_node_list_gpu_node.csv")) as f:
        return sum(int(r["gpu"]) for r in csv.DictReader(f))


def gpu_pods(d, trace):
    path = os.path.join(d, f"openb_pod_list_{trace}.csv")
    pods = []
    with open(path) as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            try:
                count, milli = int(r["num_gpu"]), int(r["gpu_milli"])
            except (KeyError, ValueError) as e:
                sys.exit(f"{path}:{line}: num_gpu/gpu_milli: {e}")
            if count > 0:
                pods.append((count, milli))
    return pods


def arrived(pods, gpus, seed):
    """GPU items (milli) of the pods arrived when demand reaches 100 % of capacity."""
    rng = random.Random(seed)
    order = pods[:]
    rng.shuffle(order)
    capacity, total, items, i = gpus * GPU_MILLI, 0, [], 0
    while True:
        count, milli = order[i] if i < len(order) else rng.choice(pods)
        i += 1
        whole = count > 1 or milli >= GPU_MILLI
        demand = count * GPU_MILLI if whole else milli
        if total + demand > capacity:
            return items
        total += demand
        items += [GPU_MILLI] * count if whole else [milli]


def best_fit_decreasing(items, gpus):
    free, empty, packed = [], gpus, 0
    for s in sorted(items, reverse=True):
        j = bisect.bisect_left(free, s)
        if j < len(free):
            f = free.pop(j)
        elif empty > 0:
            empty, f = empty - 1, GPU_MILLI
        else:
            continue
        packed += s
        bisect.insort(free, f - s)
    return packed


def lp_floor(items, gpus):
    """Most milli-GPU the cutting-stock LP packs into `gpus` GPUs (an upper bound)."""
    import numpy as np
    from scipy.optimize import linprog

    count = Counter(items)
    sizes = sorted(count)
    if any(s % UNIT for s in sizes):
        sys.exit(f"a gpu_milli is not a multiple of {UNIT}")
    m = len(sizes)
    avail = np.array([count[s] for s in sizes], float)
    value = np.array(sizes, float)
    columns = [np.eye(m)[i] for i in range(m)]
    cap = GPU_MILLI // UNIT
    weight = [s // UNIT for s in sizes]
    while True:
        a = np.array(columns).T
        a_ub = np.vstack([a, np.ones((1, a.shape[1]))])
        b_ub = np.concatenate([avail, [gpus]])
        res = linprog(-(value @ a), A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if res.status != 0:
            sys.exit(f"LP failed: {res.message}")
        duals = -res.ineqlin.marginals
        price, per_gpu = duals[:m], duals[m]
        # Pricing: the pattern (one GPU's items) of most value at these prices, a bounded
        # knapsack (binary splitting of each size's count into 0/1 items).
        profit = value - price
        best = [0.0] * (cap + 1)
        pattern = [np.zeros(m) for _ in range(cap + 1)]
        for i in range(m):
            if profit[i] <= 1e-9:
                continue
            left, k = int(min(avail[i], cap // weight[i])), 1
            while left > 0:
                take = min(k, left)
                left, k = left - take, k * 2
                w, p = take * weight[i], take * profit[i]
                for c in range(cap, w - 1, -1):
                    if best[c - w] + p > best[c] + 1e-12:
                        best[c] = best[c - w] + p
                        pattern[c] = pattern[c - w].copy()
                        pattern[c][i] += take
        c = max(range(cap + 1), key=lambda c: best[c])
        if best[c] <= per_gpu + 1e-6:
            return -res.fun
        columns.append(pattern[c])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", default=TRACES)
    ap.add_argument("--seeds", default="42,43,44")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    d = openb_dir()
    gpus = gpu_count(d)
    print("trace\tLP floor %\tbest-fit decreasing %\t(unallocated GPU % at arrived = 100 %, mean over seeds)")
    for t in args.traces:
        pods = gpu_pods(d, t)
        lp, bfd = [], []
        for seed in seeds:
            items = arrived(pods, gpus, seed)
            cap = gpus * GPU_MILLI
            lp.append(100 * (1 - lp_floor(items, gpus) / cap))
            bfd.append(100 * (1 - best_fit_decreasing(items, gpus) / cap))
        print(f"{t}\t{sum(lp) / len(lp):.2f}\t{sum(bfd) / len(bfd):.2f}", flush=True)


if __name__ == "__main__":
    main()
