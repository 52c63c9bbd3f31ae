# Sourced by compare_shm.sh and ab_shm.sh: our tools over shm cables, one run each. Every
# function prints the rate (frames per second) the receiving side got; 60-byte frames,
# pktgen on core 0, the receiver or l2fwd on core 1.
#
#   shm_oneway BIN_DIR KIND SECONDS TMP_DIR    pktgen --max --tx-only -> cable -> pktgen --rx-only
#   shm_forward BIN_DIR KIND SECONDS TMP_DIR   pktgen --max -> cable A -> l2fwd -> cable B -> pktgen

# Two tools run at once: each gets a runtime directory of its own (RUNTIME_DIRECTORY, where
# the tools put their telemetry socket, as DPDK's EAL does), so that both may use the
# default --file-prefix; a build from before telemetry ignores it.

# The field FIELD of the last JSON line on stdin.
shm_json() {
    python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"
}

# One way: the receiver first (it waits for the link), then the sender; frames received
# over the sender's sending time.
shm_oneway() {
    local bin=$1 kind=$2 secs=$3 tmp=$4 n="shm$$-ow-$RANDOM"
    RUNTIME_DIRECTORY="$tmp/run-rx" "$bin/pktgen" --port "$kind:wire=shm:$n" --lcores 1 \
        --rx-only --duration $((secs + 3)) --link-timeout 10 --json >"$tmp/rx.json" 2>"$tmp/rx.err" &
    local rx=$!
    "$bin/pktgen" --port "$kind:wire=shm:$n" --lcores 0 --max --tx-only --size 60 \
        --duration "$secs" --json >"$tmp/tx.json" 2>"$tmp/tx.err"
    # The receiver runs 3 s longer than the sender, so that the frames still on the cable
    # when the sender stops are counted too.
    wait "$rx"
    python3 -c "print($(shm_json rx_packets <"$tmp/rx.json") / $(shm_json duration_s <"$tmp/tx.json"))"
}

# Through l2fwd: what pktgen receives back per second of sending.
shm_forward() {
    local bin=$1 kind=$2 secs=$3 tmp=$4 n="shm$$-fw-$RANDOM"
    RUNTIME_DIRECTORY="$tmp/run-l2fwd" "$bin/l2fwd" --port "$kind:wire=shm:$n-a" \
        --port "$kind:wire=shm:$n-b" --lcores 1 --stats-interval 0 --json >"$tmp/l2.json" 2>"$tmp/l2.err" &
    local l2=$!
    "$bin/pktgen" --port "$kind:wire=shm:$n-a" --port "$kind:wire=shm:$n-b" --lcores 0 --max \
        --size 60 --duration "$secs" --json >"$tmp/pg.json" 2>"$tmp/pg.err"
    kill -INT "$l2"
    wait "$l2" || true
    shm_json rx_pps <"$tmp/pg.json"
}
