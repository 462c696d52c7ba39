#!/bin/bash
# Time from kill -9 of the leader of three replicated masters to another master logging that it
# leads its group (it has confirmed its lead and rebuilt its state from the registry), on this
# machine (docs/benchmarks.md, "Replicated masters").
#
#   tools/bench/ha-election.sh [RUNS]      (after cargo build --release --bins; ET=300ms to
#                                          change cluster.election_timeout, default 1s)
cd "$(dirname "$0")/../.."
RUNS=${1:-20}
for run in $(seq 1 $RUNS); do
  D=$(mktemp -d /tmp/ha-election.XXXX)
  port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  P=(0 $(port) $(port) $(port))
  for id in 1 2 3; do
    cat > $D/m$id.yaml <<YAML
master:
  allocation_interval: 5ms
cluster:
  id: $id
  election_timeout: ${ET:-1s}
  peers:
    1: 127.0.0.1:${P[1]}
    2: 127.0.0.1:${P[2]}
    3: 127.0.0.1:${P[3]}
YAML
    NO_COLOR=1 RUST_LOG=info target/release/ringmaster serve --listen 127.0.0.1:${P[$id]} --http none --config $D/m$id.yaml --work-dir $D/w$id > $D/log$id 2>&1 &
    echo $! > $D/pid$id
  done
  leader=""
  for i in $(seq 1 1000); do
    for id in 1 2 3; do grep -q "this master leads its group" $D/log$id && leader=$id; done
    [ -n "$leader" ] && break; sleep 0.01
  done
  sleep 1  # let the group settle
  leader=""
  for i in $(seq 1 1000); do
    for id in 1 2 3; do grep "this master leads\|no longer leads" $D/log$id | tail -1 | grep -q "this master leads" && leader=$id; done
    [ -n "$leader" ] && break; sleep 0.01
  done
  [ -z "$leader" ] && { echo "$run no leader"; continue; }
  declare -A c; for id in 1 2 3; do c[$id]=$(grep -c "this master leads its group" $D/log$id); done
  t0=$(date +%s.%N); kill -9 $(cat $D/pid$leader)
  new=""
  while [ -z "$new" ]; do
    for id in 1 2 3; do [ $id != $leader ] && [ $(grep -c "this master leads its group" $D/log$id) -gt ${c[$id]} ] && new=$id; done
    [ -z "$new" ] && sleep 0.005
  done
  t1=$(date +%s.%N)
  echo "$run $(echo "($t1 - $t0) * 1000" | bc -l | cut -d. -f1) ms (leader $leader -> $new)"
  for id in 1 2 3; do kill -9 $(cat $D/pid$id) 2>/dev/null; done
  wait 2>/dev/null
  rm -rf $D
done
