// swift-tools-version:6.0
// PeerMesh: MultipeerConnectivity-style sessions on Linux, and a LAN audio relay built on them.
import PackageDescription

let package = Package(
    name: "PeerMesh",
    products: [
        .library(name: "PeerMesh", targets: ["PeerMesh"]),
        .library(name: "MeshAudio", targets: ["MeshAudio"]),
        .library(name: "MeshPipeline", targets: ["MeshPipeline"]),
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
        .systemLibrary(name: "CPThread"),

        // Libraries.
        .target(name: "PeerMesh", dependencies: ["CAvahi"]),
        .target(name: "MeshAudio", dependencies: ["CALSA", "CSndfile", "CPThread"]),
        .target(name: "MeshPipeline", dependencies: ["MeshAudio", "CSpeexDSP"]),
        .target(name: "MeshRelay", dependencies: ["PeerMesh", "MeshAudio", "MeshPipeline"]),

        // Command-line tools.
        .executableTarget(name: "mesh-record", dependencies: ["MeshRelay"]),
        .executableTarget(name: "mesh-play", dependencies: ["MeshRelay"]),
        .executableTarget(name: "mesh-impair", dependencies: ["MeshRelay"]),
        .executableTarget(name: "peermesh-probe", dependencies: ["PeerMesh"]),
        .executableTarget(name: "mesh-bench", dependencies: ["PeerMesh", "MeshRelay"]),

        // Tests.
        .testTarget(name: "PeerMeshTests", dependencies: ["PeerMesh"]),
        .testTarget(name: "MeshAudioTests", dependencies: ["MeshAudio"]),
        .testTarget(name: "MeshPipelineTests", dependencies: ["MeshPipeline", "MeshAudio"]),
        .testTarget(name: "MeshRelayTests", dependencies: ["MeshRelay", "PeerMesh", "MeshAudio", "MeshPipeline"]),
    ],
    swiftLanguageModes: [.v6]
)
