#!/usr/bin/env python3
"""How much GPU the openb trace's GPU shares strand even when packed offline.

Packs every task that asks for part of one GPU (num_gpu = 1, gpu_milli < 1000) by best-fit
decreasing -- all tasks known in advance, sorted, no cpu, memory or node limits -- and prints
the milli-GPU left on the GPUs they use, as a share of the cluster's GPU capacity. An online
placer sees the tasks one at a time in arrival order and must also fit cpu and memory, so this
is what the shares alone cost under far easier conditions (an estimate, not a proof: best-fit
decreasing is near, not at, the optimum).

usage: tools/bench/share-packing.py [NODES_CSV] [TASKS_CSV]
"""
import bisect
import collections
import csv
import sys

nodes = sys.argv[1] if len(sys.argv) > 1 else "testdata/openb/openb_node_list_all_node.csv"
tasks = sys.argv[2] if len(sys.argv) > 2 else "testdata/openb/openb_pod_list_default.csv"

capacity = sum(int(n["gpu"]) for n in csv.DictReader(open(nodes))) * 1000
shares = sorted(
    (int(t["gpu_milli"]) for t in csv.DictReader(open(tasks))
     if int(t["num_gpu"]) == 1 and int(t["gpu_milli"]) < 1000),
    reverse=True,
)
free = []  # free milli of each GPU in use, sorted
for s in shares:
    i = bisect.bisect_left(free, s)
    if i < len(free):
        left = free.pop(i) - s
    else:
        left = 1000 - s
    bisect.insort(free, left)
left = sum(free)
lone = collections.Counter(free)
print(f"shares: {len(shares)} tasks, {sum(shares)} milli-GPU on {len(free)} GPUs")
print(f"left on those GPUs: {left} milli-GPU = {100 * left / capacity:.2f} % of {capacity // 1000} GPUs")
print(f"  of which 190 beside a 0.81 share: {190 * lone[190]} milli-GPU = "
      f"{100 * 190 * lone[190] / capacity:.2f} %")
print("  most common leftovers (milli-GPU: GPUs):", lone.most_common(8))
