# ship-build.sh — builds a product the way it ships (sourced by scripts/package and scripts/bench).
#
#   ship_build PRODUCT   swift build -c release into .build/package, with:
#     --static-swift-stdlib        the Swift runtime and FoundationEssentials linked in: the package depends only on
#                                  Debian's own libraries
#     lld -z pack-relative-relocs  relative relocations in RELR form (DT_RELR, glibc ≥ 2.36: Debian 12 has 2.36).
#                                  gold writes them as 40,000 RELA entries (975 KB in mesh-record) that the loader
#                                  reads at every start; RELR holds the same in 8 KB. Measured on the JACK rig with a
#                                  player: mesh-record 21.4 → 20.1 MB resident (VmHWM − RssShmem), two runs each.
#     -function-sections, and lld --symbol-ordering-file=packaging/order/audio.order
#                                  the functions the audio CLIs run (recorded by scripts/orderfile) laid out first and
#                                  together, so they sit on few pages. Measured on the JACK rig (clean builds with
#                                  and without the order file, two runs each): resident text of mesh-play 6.2–6.4 →
#                                  4.5–4.6 MB and of mesh-record 6.5–6.7 → 4.7–4.9 MB; VmHWM − RssShmem of mesh-play
#                                  17.4–17.8 → 15.7–15.8 MB, of mesh-record 17.1–17.4 → 15.3–15.5 MB.
#                                  A build directory that holds objects compiled before -function-sections keeps
#                                  them (whole-module builds rewrite an object only when its IR changed): the order
#                                  then does not apply to those modules. So the build directory is emptied when the
#                                  flags or the order differ from those its objects were built with
#                                  (.build/package/.ship-flags).
# Needs ROOT (the checkout).
ship_build() {
    local product=${1:?usage: ship_build PRODUCT} order=()
    [[ -s $ROOT/packaging/order/audio.order ]] && order=(-Xlinker "--symbol-ordering-file=$ROOT/packaging/order/audio.order"
                                                           -Xlinker --no-warn-symbol-ordering)
    local flags=(-c release --static-swift-stdlib -Xswiftc -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs
                 -Xswiftc -Xfrontend -Xswiftc -function-sections "${order[@]}")
    local dir=$ROOT/.build/package stamp
    stamp=$(printf '%s\n' "${flags[@]}"; [[ -s $ROOT/packaging/order/audio.order ]] && sha256sum <"$ROOT/packaging/order/audio.order" || true)
    if [[ -d $dir && "$(cat "$dir/.ship-flags" 2>/dev/null)" != "$stamp" ]]; then
        echo "ship-build: build flags changed; rebuilding $dir from scratch" >&2
        rm -rf "$dir"
    fi
    mkdir -p "$dir" && printf '%s\n' "$stamp" >"$dir/.ship-flags"
    # shellcheck source=logged-build.sh
    source "$ROOT/scripts/lib/logged-build.sh"
    logged_build "ship-build: building $product" swift build "${flags[@]}" --build-path "$dir" --product "$product"
}
