// swift-tools-version:6.0
// PeerMesh: MultipeerConnectivity-style sessions on Linux, and a LAN audio relay built on them.
//
// Module graph (each arrow: "depends on"):
//
//   mesh-record, mesh-play, mesh-chat, mesh-impair, mesh-bench, peermesh-probe ──▶ MeshCLI ──▶ MeshRelay ──▶ PeerMesh ──▶ MeshPOSIX
//                                                             │            └────────▶ MeshPipeline ──▶ MeshAudio ──▶ MeshPOSIX
//                                                             └──▶ MeshImpair ──▶ MeshPOSIX
//   C leaves: CALSA, CSndfile (MeshAudio) · CSpeexDSP, COpus (MeshPipeline) · CAvahi, CSodium, COpenSSL (PeerMesh)
//             · CLinux (MeshPOSIX)
//             · CQRencode, CSystemd (MeshCLI)
//   peermesh-fuzz ──▶ PeerMesh, MeshPipeline, MeshAudio, MeshRelay, MeshCLI (every decoder of outside bytes)
import PackageDescription

let package = Package(
    name: "PeerMesh",
    products: [
        .library(name: "PeerMesh", targets: ["PeerMesh"]),
        .library(name: "PeerMeshFoundation", targets: ["PeerMeshFoundation"]),
        .library(name: "MeshAudio", targets: ["MeshAudio"]),
        .library(name: "MeshPipeline", targets: ["MeshPipeline"]),
        .library(name: "MeshRelay", targets: ["MeshRelay"]),
        .executable(name: "mesh-record", targets: ["mesh-record"]),
        .executable(name: "mesh-play", targets: ["mesh-play"]),
        .executable(name: "mesh-impair", targets: ["mesh-impair"]),
        .executable(name: "peermesh-probe", targets: ["peermesh-probe"]),
        .executable(name: "mesh-chat", targets: ["mesh-chat"]),
        .executable(name: "mesh-bench", targets: ["mesh-bench"]),
        .executable(name: "peermesh-fuzz", targets: ["peermesh-fuzz"]),
    ],
    targets: [
        // C is a leaf: one system-library target per C library.
        .systemLibrary(name: "CALSA", pkgConfig: "alsa", providers: [.apt(["libasound2-dev"])]),
        .systemLibrary(name: "CAvahi", pkgConfig: "avahi-client", providers: [.apt(["libavahi-client-dev"])]),
        // Header-only: MeshAudio loads libsndfile with dlopen when it opens the first sound file.
        .systemLibrary(name: "CSndfile", providers: [.apt(["libsndfile1-dev"])]),
        .systemLibrary(name: "CSpeexDSP", pkgConfig: "speexdsp", providers: [.apt(["libspeexdsp-dev"])]),
        // Header-only: MeshPipeline loads libopus with dlopen when it makes the first Opus encoder or decoder.
        .systemLibrary(name: "COpus", providers: [.apt(["libopus-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        // Header-only: PeerMesh loads libcrypto with dlopen when it first hashes a resource (the audio CLIs never do).
        .systemLibrary(name: "COpenSSL", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CQRencode", pkgConfig: "libqrencode", providers: [.apt(["libqrencode-dev"])]),
        // Header-only: MeshCLI loads libsystemd with dlopen when a service manager listens (NOTIFY_SOCKET).
        .systemLibrary(name: "CSystemd", providers: [.apt(["libsystemd-dev"])]),
        .systemLibrary(name: "CLinux"),   // glibc's epoll, eventfd, accept4 and thread names (not in Swift's Glibc module)

        // Shared POSIX plumbing (package-internal): syscall funnel, sockets, event loop, clock, threads, writers.
        .target(name: "MeshPOSIX", dependencies: ["CLinux"]),

        // Libraries.
        .target(name: "PeerMesh", dependencies: ["MeshPOSIX", "CAvahi", "CSodium", "COpenSSL"]),
        // MC's Foundation `Progress` for resources, for apps that link full Foundation anyway (PeerMesh does not).
        .target(name: "PeerMeshFoundation", dependencies: ["PeerMesh"]),
        .target(name: "MeshAudio", dependencies: ["MeshPOSIX", "CALSA", "CSndfile"]),
        .target(name: "MeshPipeline", dependencies: ["MeshAudio", "MeshPOSIX", "CSpeexDSP", "COpus"]),
        .target(name: "MeshRelay", dependencies: ["PeerMesh", "MeshAudio", "MeshPipeline", "MeshPOSIX"]),

        // Test tools.
        .target(name: "MeshImpair", dependencies: ["MeshPOSIX"]),

        // The command-line front door, options, terminal and status output of every executable (package-internal).
        .target(name: "MeshCLI", dependencies: ["MeshRelay", "MeshImpair", "MeshPOSIX", "CQRencode", "CSystemd"]),

        // Command-line tools.
        .executableTarget(name: "mesh-record", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-play", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-impair", dependencies: ["MeshCLI"]),
        .executableTarget(name: "peermesh-probe", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-chat", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-bench", dependencies: ["MeshCLI"]),
        // Every decoder of outside bytes, as a libFuzzer target (scripts/fuzz builds it with -sanitize=fuzzer and
        // -DFUZZING) or, in a plain build, a replayer of the corpus in fuzz/corpus.
        .executableTarget(name: "peermesh-fuzz", dependencies: ["PeerMesh", "MeshPipeline", "MeshAudio", "MeshRelay", "MeshCLI"]),

        // Tests, and what they share (package-internal).
        .target(name: "MeshTestSupport", dependencies: ["MeshPOSIX", "MeshAudio", "PeerMesh"], path: "Tests/MeshTestSupport"),
        .testTarget(name: "PeerMeshTests", dependencies: ["PeerMesh", "PeerMeshFoundation", "MeshTestSupport"]),
        .testTarget(name: "MeshAudioTests", dependencies: ["MeshAudio", "MeshTestSupport"]),
        .testTarget(name: "MeshPipelineTests", dependencies: ["MeshPipeline", "MeshAudio", "MeshTestSupport"]),
        .testTarget(name: "MeshRelayTests", dependencies: ["MeshRelay", "PeerMesh", "MeshAudio", "MeshPipeline", "MeshImpair",
                                                          "MeshCLI", "MeshTestSupport"]),
        .testTarget(name: "MeshImpairTests", dependencies: ["MeshImpair", "MeshTestSupport"]),
        .testTarget(name: "MeshCLITests", dependencies: ["MeshCLI", "MeshAudio", "MeshRelay", "PeerMesh", "MeshTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
