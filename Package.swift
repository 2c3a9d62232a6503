// swift-tools-version: 6.0
import PackageDescription

// The client's transports: SwiftNIO's WebSocket on every platform (over Network.framework on
// Apple's, NIOPosix and NIOSSL on Linux), and libwebsockets on Linux, where the server links it
// anyway. An Apple app links no libwebsockets; TANDEM_WITHOUT_LIBWEBSOCKETS=1 builds the client
// that way here, so that scripts/check-layers checks it builds, links and syncs without it.
let applePlatforms: [Platform] = [.macOS, .iOS, .tvOS, .watchOS, .visionOS]
let clientTransport: [Target.Dependency] =
    (Context.environment["TANDEM_WITHOUT_LIBWEBSOCKETS"] == "1"
        ? [] : [.target(name: "TandemSocket", condition: .when(platforms: [.linux]))])
    + [
        .product(name: "NIOCore", package: "swift-nio"),
        .product(name: "NIOPosix", package: "swift-nio"),
        .product(name: "NIOHTTP1", package: "swift-nio"),
        .product(name: "NIOWebSocket", package: "swift-nio"),
        .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(platforms: [.linux])),
        .product(
            name: "NIOTransportServices", package: "swift-nio-transport-services",
            condition: .when(platforms: applePlatforms)),
    ]

let package = Package(
    name: "Tandem",
    // Mutex, Atomic and String(validating:) need macOS 15 and iOS 18. On Apple platforms the
    // client syncs over SwiftNIO and Network.framework and links no libwebsockets (README,
    // "Platforms").
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "Tandem", targets: ["Tandem"]),
        .library(name: "TandemClient", targets: ["TandemClient"]),
        .library(name: "TandemServer", targets: ["TandemServer"]),
        .library(name: "TandemServerPostgres", targets: ["TandemServerPostgres"]),
        .library(name: "TandemTesting", targets: ["TandemTesting"]),
        .library(name: "TandemWire", targets: ["TandemWire"]),
        .executable(name: "tandem", targets: ["tandem"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-transport-services", from: "1.28.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibWebSockets",
            path: "Sources/CLibWebSockets",
            pkgConfig: "libwebsockets",
            providers: [.apt(["libwebsockets-dev"]), .brew(["libwebsockets"])]
        ),
        .systemLibrary(
            name: "CLibPQ",
            path: "Sources/CLibPQ",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"]), .brew(["libpq"])]
        ),
        // The layers, from the bottom (README, "Layout", draws them):
        //   TandemWire       the wire protocol: messages, JSON, resume tokens; no I/O
        //   TandemSocket     the libwebsockets transport (client and server)
        //   TandemClient     the protocol client: connection, requests, listens; no GRDB
        //   TandemSQLite     values bound straight to GRDB statements, for per-document paths;
        //                    SQLite's process-wide settings (through CTandemSQLite)
        //   Tandem           the client sync library (GRDB), on TandemClient
        //   TandemServer     the companion server (its SQLite store)
        //   TandemServerPostgres  its PostgreSQL store (libpq), for many nodes
        //   TandemHarness    threads, temporary folders, ports, child processes, waiting
        //   TandemLocal      servers and devices in this process or as child processes, throwaway
        //                    PostgreSQL clusters: what the demo, soak and bench run
        //   TandemScenarios  what the command runs besides serving: demo, soak, bench
        //   TandemSocketTesting  a raw WebSocket client, for bad input (no GRDB, no server)
        //   TandemTesting    the test fixtures: test servers and devices configured from the
        //                    environment, checkpoints, certificates, the conformance suite
        //   tandem           the command; it links no test fixture
        .target(name: "TandemWire"),
        .target(
            name: "TandemSocket",
            dependencies: [
                "CLibWebSockets",
                "TandemWire",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "TandemClient",
            dependencies: ["TandemWire", .product(name: "Logging", package: "swift-log")] + clientTransport
        ),
        // One C function: sqlite3_config is variadic, which Swift cannot call.
        .target(name: "CTandemSQLite", linkerSettings: [.linkedLibrary("sqlite3")]),
        // A disk whose fsync fails on demand (a SQLite VFS), for tests of commits that fail.
        .target(name: "CTandemFailingDisk", linkerSettings: [.linkedLibrary("sqlite3")]),
        // Linux's epoll for the bench's listener swarm (Swift's Glibc module leaves it out).
        .target(name: "CEpoll"),
        .target(
            name: "TandemSQLite", dependencies: ["CTandemSQLite", .product(name: "GRDB", package: "GRDB.swift")]),
        .target(
            name: "Tandem",
            dependencies: [
                "TandemClient",
                "TandemSQLite",
                "TandemWire",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "TandemServer",
            dependencies: [
                "TandemSQLite",
                "TandemWire",
                "TandemSocket",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                // JWT signatures (RS256, ES256, EdDSA, HS256), and the identity provider's key
                // set fetched over HTTPS.
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Server/TandemServer",
            // The live console's page, style and script, embedded in the binary.
            resources: [
                .embedInCode("Console/console.html"), .embedInCode("Console/console.css"),
                .embedInCode("Console/console.js"),
            ]
        ),
        // The PostgreSQL store, for many nodes: libpq, which an app embedding the SQLite server
        // does not link.
        .target(
            name: "TandemServerPostgres",
            dependencies: [
                "TandemServer", "TandemWire", "CLibPQ", .product(name: "Logging", package: "swift-log"),
            ],
            path: "Server/TandemServerPostgres"
        ),
        .target(name: "TandemHarness", dependencies: ["TandemWire"]),
        .target(
            name: "TandemLocal",
            dependencies: [
                "TandemHarness", "Tandem", "TandemClient", "TandemServer", "TandemServerPostgres", "TandemWire",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "TandemScenarios",
            dependencies: [
                "TandemLocal", "TandemHarness", "Tandem", "TandemClient", "TandemServer", "TandemServerPostgres",
                "TandemSocket", "TandemWire",
                .target(name: "CEpoll", condition: .when(platforms: [.linux])),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ]
        ),
        .target(
            name: "TandemSocketTesting", dependencies: ["TandemHarness", "TandemClient", "TandemSocket", "TandemWire"]),
        .target(
            name: "TandemTesting",
            dependencies: [
                "TandemLocal", "TandemHarness", "TandemSocketTesting", "Tandem", "TandemClient", "TandemServer",
                "TandemServerPostgres", "TandemSocket", "TandemWire", "CTandemFailingDisk",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "tandem",
            dependencies: [
                "TandemClient",
                "TandemHarness",
                "TandemLocal",
                "TandemScenarios",
                "TandemServer",
                "TandemServerPostgres",
                "TandemSocket",
                "TandemSQLite",
                "TandemWire",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The fuzz harness (a library, so the corpus replay test can use it) and its driver:
        // libFuzzer's with scripts/fuzz, a corpus replay otherwise.
        .target(
            name: "TandemFuzzing",
            dependencies: ["TandemClient", "TandemServer", "TandemTesting", "TandemWire"],
            path: "Fuzz/Harness"
        ),
        .executableTarget(name: "tandem-fuzz", dependencies: ["TandemFuzzing"], path: "Fuzz/Entry"),
        // README's getting-started code, built with everything else and run by the tests.
        .executableTarget(
            name: "tandem-getting-started",
            dependencies: ["Tandem", .product(name: "GRDB", package: "GRDB.swift")],
            path: "Examples/GettingStarted"
        ),
        .testTarget(name: "TandemWireTests", dependencies: ["TandemWire"]),
        .testTarget(
            name: "TandemSocketTests", dependencies: ["TandemSocket", "TandemSocketTesting", "TandemHarness"]),
        .testTarget(
            name: "TandemServerTests",
            dependencies: [
                "TandemServer", "TandemServerPostgres", "TandemWire", "TandemSocket", "TandemClient", "TandemTesting",
                "TandemFuzzing", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]
        ),
        .testTarget(
            name: "TandemTests",
            dependencies: [
                "Tandem", "TandemClient", "TandemSocket", "TandemWire", "TandemTesting",
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
        .testTarget(
            name: "SyncIntegrationTests",
            dependencies: [
                "Tandem", "TandemServer", "TandemServerPostgres", "TandemScenarios", "TandemTesting", "TandemWire",
            ],
            exclude: ["Fixtures"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
