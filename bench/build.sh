# Sourced by the bench scripts, from the source root: the settings they share
# and build_targets, which configures $build (when it holds no build yet) and
# compiles the targets it is given. Log: $logs/build.log.
logs=${1:-bench-logs}
build=${BUILD:-build-gpu}
reps=${REPS:-5}
mkdir -p "$logs"

build_targets()
{
    if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" -Dgpu_archs="${GPU_ARCHS:-90}" -Dmpi=disabled -Ddocs=disabled >"$logs/build.log" 2>&1 \
            || { tail -40 "$logs/build.log"; exit 1; }
    fi
    meson compile -C "$build" "$@" >>"$logs/build.log" 2>&1 \
        || { grep -E "error|FAILED" "$logs/build.log" | head -40; exit 1; }
}
