# Shell helpers the suites share (sourced, not run).

# serve_port LOG PID [TRIES]: waits (TRIES x 0.1 s, default 300) for the server PID to log its
# address in LOG and prints its port; prints nothing when the server exited or never said.
serve_port() {
    local log=$1 pid=$2 tries=${3:-300} port=
    for _ in $(seq 1 "$tries"); do
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$')
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    printf '%s' "$port"
}
