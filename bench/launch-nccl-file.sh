#!/bin/sh
# Start infinicp-bench as N processes on this host, one per GPU, bootstrapping
# NCCL through a file (no MPI): rank 0 writes the ncclUniqueId to ID_FILE, the
# others read it. For several hosts, start the same command line on each with
# RANK / WORLD_SIZE set and ID_FILE on storage they all see.
# Usage: bench/launch-nccl-file.sh N [infinicp-bench options...]
# Environment: BENCH (default build/tools/infinicp-bench), ID_FILE (default a
# fresh name under ${TMPDIR:-/tmp}).
set -u
n=${1:?usage: launch-nccl-file.sh N [infinicp-bench options]}
shift
bench=${BENCH:-build/tools/infinicp-bench}
id=${ID_FILE:-${TMPDIR:-/tmp}/infinicp-nccl-id.$$}
rm -f "$id"
# NVLink multicast off, as the bench itself does unless told otherwise
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
pids=
r=0
while [ "$r" -lt "$n" ]; do
    "$bench" --device cuda --transport nccl-file --rank "$r" --size "$n" --nccl-id-file "$id" "$@" &
    pids="$pids $!"
    r=$((r + 1))
done
status=0
for p in $pids; do
    wait "$p" || status=1
done
rm -f "$id"
exit $status
