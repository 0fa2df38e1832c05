#!/usr/bin/env bash
# Installs the Debian packages that dsv4's build and tests need, and only those missing.
# Works as root (a minimal Debian 12 has no sudo) and as a user with sudo, with Debian's nodejs
# and with NodeSource's (which ships npm itself: asking apt for npm then would conflict).
# Says what it installs and why. Non-interactive, so it runs in CI with no stdin.
set -euo pipefail

# package, then why the project needs it: the one list of what the build and tests use
PACKAGES=(
    "build-essential|the C compiler, make and libc headers (gcc's OpenMP included)"
    "libcjson-dev|JSON: config.json, safetensors headers, the server's requests"
    "libpcre2-dev|the tokenizer's pre-tokenizer regular expressions"
    "libmicrohttpd-dev|the HTTP server (dsv4 serve)"
    "libutf8proc-dev|Unicode normalization and character classes for the tokenizer"
    "python3|the test suites' comparators and vector generators (tests/tools)"
    "nodejs|the test clients: the Hugging Face tokenizer, the openai client, the chat page driver"
    "npm|fetches the test clients' pinned packages (tests/node, tests/serve)"
    "ca-certificates|npm reaches its registry over HTTPS"
    "chromium|the chat page test in a headless browser (tests/serve/web.mjs)"
    "curl|the server test's stream that is in flight when the server is stopped"
    "clang|the fuzz targets (libFuzzer) and the sanitized server build the tests run"
    "libclang-rt-dev|clang's sanitizer and libFuzzer runtimes (clang does not pull them in)"
    "libomp-dev|OpenMP for the clang builds of the library"
)

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "deps.sh: installing packages needs root: run it as root, or install sudo" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps.sh: this script installs Debian packages with apt-get; install the packages listed in it by hand" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive

installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }

# A package counts as present when dpkg has it, or, for the tools, when its command is already on
# the PATH from elsewhere: NodeSource's nodejs ships npm, and an npm asked of apt beside it conflicts.
present() {
    case "$1" in
        npm) command -v npm >/dev/null 2>&1 || installed npm ;;
        nodejs) command -v node >/dev/null 2>&1 || installed nodejs ;;
        python3) command -v python3 >/dev/null 2>&1 || installed python3 ;;
        chromium) command -v chromium >/dev/null 2>&1 || installed chromium ;;
        curl) command -v curl >/dev/null 2>&1 || installed curl ;;
        *) installed "$1" ;;
    esac
}

updated=0
apt_install() {
    if [ $updated -eq 0 ]; then
        echo "deps.sh: apt-get update"
        "${SUDO[@]}" apt-get update -q
        updated=1
    fi
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "$@"
}

# nodejs goes first and alone: which nodejs apt picks (Debian's or NodeSource's) decides whether
# npm still needs installing.
missing=()
for entry in "${PACKAGES[@]}"; do
    p=${entry%%|*}
    present "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps.sh: every package the build and tests need is installed"
    exit 0
fi
echo "deps.sh: installing:"
for entry in "${PACKAGES[@]}"; do
    p=${entry%%|*}
    for m in "${missing[@]}"; do [ "$m" = "$p" ] && printf '  %-18s %s\n' "$p" "${entry#*|}"; done
done
rest=()
for m in "${missing[@]}"; do
    case "$m" in
        nodejs) apt_install nodejs ;;
        npm) ;;
        *) rest+=("$m") ;;
    esac
done
for m in "${missing[@]}"; do
    if [ "$m" = npm ]; then
        if command -v npm >/dev/null 2>&1; then
            echo "deps.sh: npm came with nodejs; not installing Debian's npm"
        else
            rest+=(npm)
        fi
    fi
done
[ ${#rest[@]} -eq 0 ] || apt_install "${rest[@]}"
echo "deps.sh: done"
