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

# npm_deps DIR PKG...: the npm packages DIR's package.json and lock pin, installed outside the
# source tree (build/npm/NAME/node_modules, NAME = DIR's last part) and reached through
# DIR/node_modules, a link, so a search of tests/ meets only the project's own files. Installs
# (npm ci, else npm install) when one of PKG... is missing; an older checkout's DIR/node_modules
# folder moves there first. Fails when the install does.
npm_deps() {
    local dir=$1 name store p need=0
    shift
    name=$(basename "$dir")
    store=build/npm/$name
    mkdir -p "$store" || return 1
    if [ -d "$dir/node_modules" ] && [ ! -L "$dir/node_modules" ]; then
        if [ -e "$store/node_modules" ]; then rm -rf "$dir/node_modules"; else mv "$dir/node_modules" "$store/"; fi
    fi
    ln -sfn "../../$store/node_modules" "$dir/node_modules" || return 1
    for p in "$@"; do
        [ -d "$store/node_modules/$p" ] || need=1
    done
    [ "$need" = 0 ] && return 0
    cp "$dir/package.json" "$dir/package-lock.json" "$store/" || return 1
    (cd "$store" && (timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 ||
        timeout 300 npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1))
}
