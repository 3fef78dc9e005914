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
#                                  together, so they sit on few pages: resident text of mesh-play 6.7 → 4.7 MB.
# Needs ROOT (the checkout).
ship_build() {
    local product=${1:?usage: ship_build PRODUCT} order=()
    [[ -s $ROOT/packaging/order/audio.order ]] && order=(-Xlinker "--symbol-ordering-file=$ROOT/packaging/order/audio.order"
                                                           -Xlinker --no-warn-symbol-ordering)
    swift build -c release --static-swift-stdlib --build-path "$ROOT/.build/package" --product "$product" \
        -Xswiftc -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs -Xswiftc -Xfrontend -Xswiftc -function-sections \
        "${order[@]}" 2>&1 \
        | sed '/prohibited flag/d' | grep -E 'error|Build' | tail -n 1 >&2
    return "${PIPESTATUS[0]}"
}
