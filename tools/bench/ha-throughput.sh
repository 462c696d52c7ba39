#!/bin/bash
# Tasks/s end to end and registry commit latency: one master with --work-dir, or the leader of
# three replicated masters on this machine (docs/benchmarks.md, "Replicated masters").
#
#   tools/bench/ha-throughput.sh single|cluster      (after cargo build --release --bins)
#
# Runs ringmaster-loadgen (1,000 agents x 10 frameworks, TASKS tasks per framework, default
# 20000) against the master that serves, prints its result line, the masters' CPU seconds and
# the commit latency p50/p99 read from the serving master's /metrics histogram
# (registry_commit_duration for one master, replication_commit_duration for the group; buckets
# grow by 1.5x, the quantile is interpolated inside its bucket).
set -u
cd "$(dirname "$0")/../.."
MODE=${1:?single or cluster}
TASKS=${TASKS:-20000}
BIN=target/release
D=$(mktemp -d /tmp/ha-throughput.XXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P=(0 $(port) $(port) $(port)); H=(0 $(port) $(port) $(port))
if [ "$MODE" = single ]; then
  printf "limits:\n  max_connections: 20000\n" > $D/m1.yaml
  RUST_LOG=warn $BIN/ringmaster serve --listen 127.0.0.1:${P[1]} --http 127.0.0.1:${H[1]} \
    --config $D/m1.yaml --work-dir $D/w1 > $D/log1 2>&1 &
  echo $! > $D/pid1; leader=1
  until curl -sf http://127.0.0.1:${H[1]}/health > /dev/null; do sleep 0.1; done
  METRIC=registry_commit_duration
else
  for id in 1 2 3; do
    printf "limits:\n  max_connections: 20000\ncluster:\n  id: $id\n  peers:\n" > $D/m$id.yaml
    for p in 1 2 3; do printf "    $p: 127.0.0.1:${P[$p]}\n" >> $D/m$id.yaml; done
    NO_COLOR=1 RUST_LOG=warn,ringmaster::master::cluster=info $BIN/ringmaster serve \
      --listen 127.0.0.1:${P[$id]} --http 127.0.0.1:${H[$id]} --config $D/m$id.yaml \
      --work-dir $D/w$id > $D/log$id 2>&1 &
    echo $! > $D/pid$id
  done
  leader=""
  until [ -n "$leader" ]; do
    sleep 0.2
    for id in 1 2 3; do
      curl -sf http://127.0.0.1:${H[$id]}/state | grep -q '"role":"leader"' && leader=$id
    done
  done
  METRIC=replication_commit_duration
fi
timeout 600 $BIN/ringmaster-loadgen --master 127.0.0.1:${P[$leader]} --agents 1000 \
  --frameworks 10 --tasks $TASKS --master-pid $(cat $D/pid$leader) 2>&1 | grep -v "^ *[0-9]*:\|^ *at " | tail -${LINES_SHOWN:-1}
for id in 1 2 3; do
  [ -f $D/pid$id ] && echo "master $id cpu $(awk '{print ($14+$15)/100}' /proc/$(cat $D/pid$id)/stat) s"
done
curl -sf http://127.0.0.1:${H[$leader]}/metrics | python3 -c '
import re, sys
metric = sys.argv[1]
buckets = []
for line in sys.stdin:
    m = re.match("ringmaster_" + metric + r"_seconds_bucket\{le=\"([^\"]+)\"\} (\d+)", line)
    if m:
        buckets.append((float("inf") if m[1] == "+Inf" else float(m[1]), int(m[2])))
total = buckets[-1][1] if buckets else 0
def quantile(q):
    want, lo, below = q * total, 0.0, 0
    for le, count in buckets:
        if count >= want:
            inside = count - below
            return lo + (le - lo) * ((want - below) / inside if inside else 0)
        lo, below = le, count
print(f"{metric}: {total} commits, p50 {quantile(0.5)*1e3:.2f} ms, p99 {quantile(0.99)*1e3:.2f} ms")
' $METRIC
for id in 1 2 3; do [ -f $D/pid$id ] && kill -9 $(cat $D/pid$id) 2>/dev/null; done
wait 2>/dev/null
[ -n "${KEEP:-}" ] && echo "kept $D" || rm -rf $D
