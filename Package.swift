// swift-tools-version:6.0
// PeerMesh: MultipeerConnectivity-style sessions on Linux, and a LAN audio relay built on them.
import PackageDescription

let package = Package(
    name: "PeerMesh",
    products: [
        .library(name: "PeerMesh", targets: ["PeerMesh"]),
        .library(name: "MeshAudio", targets: ["MeshAudio"]),
        .library(name: "MeshRelay", targets: ["MeshRelay"]),
        .executable(name: "mesh-record", targets: ["mesh-record"]),
        .executable(name: "mesh-play", targets: ["mesh-play"]),
        .executable(name: "mesh-impair", targets: ["mesh-impair"]),
        .executable(name: "peermesh-probe", targets: ["peermesh-probe"]),
        .executable(name: "mesh-bench", targets: ["mesh-bench"]),
    ],
    targets: [
        // C is a leaf: one system-library target per C library.
        .systemLibrary(name: "CALSA", pkgConfig: "alsa", providers: [.apt(["libasound2-dev"])]),
        .systemLibrary(name: "CAvahi", pkgConfig: "avahi-client", providers: [.apt(["libavahi-client-dev"])]),
        .systemLibrary(name: "CSndfile", pkgConfig: "sndfile", providers: [.apt(["libsndfile1-dev"])]),
        .systemLibrary(name: "CSpeexDSP", pkgConfig: "speexdsp", providers: [.apt(["libspeexdsp-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),

        // Shared POSIX plumbing (package-internal): syscall funnel, sockets, event loop, clock, output writers.
        .systemLibrary(name: "CLinux"),   // glibc's epoll, eventfd and thread names (not in Swift's Glibc module)
        .target(name: "MeshPOSIX", dependencies: ["CLinux"]),

        // Libraries.
        .target(name: "PeerMesh", dependencies: ["MeshPOSIX", "CAvahi", "CSodium"]),
        .target(name: "MeshAudio", dependencies: ["CALSA", "CSndfile", "CSpeexDSP"]),
        .target(name: "MeshRelay", dependencies: ["PeerMesh", "MeshAudio"]),

        // Test tools.
        .target(name: "MeshImpair", dependencies: ["MeshPOSIX"]),

        // The command-line front door, options, terminal and status output of every executable (package-internal).
        .target(name: "MeshCLI", dependencies: ["MeshRelay", "MeshImpair", "MeshPOSIX"]),

        // Command-line tools.
        .executableTarget(name: "mesh-record", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-play", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-impair", dependencies: ["MeshCLI"]),
        .executableTarget(name: "peermesh-probe", dependencies: ["MeshCLI"]),
        .executableTarget(name: "mesh-bench", dependencies: ["PeerMesh", "MeshRelay"]),

        // Tests, and what they share (package-internal).
        .target(name: "MeshTestSupport", dependencies: ["MeshPOSIX"], path: "Tests/MeshTestSupport"),
        .testTarget(name: "PeerMeshTests", dependencies: ["PeerMesh", "MeshTestSupport"]),
        .testTarget(name: "MeshAudioTests", dependencies: ["MeshAudio"]),
        .testTarget(name: "MeshRelayTests", dependencies: ["MeshRelay", "PeerMesh", "MeshAudio", "MeshImpair", "MeshCLI"]),
        .testTarget(name: "MeshImpairTests", dependencies: ["MeshImpair", "MeshTestSupport"]),
        .testTarget(name: "MeshCLITests", dependencies: ["MeshCLI"]),
    ],
    swiftLanguageModes: [.v6]
)
