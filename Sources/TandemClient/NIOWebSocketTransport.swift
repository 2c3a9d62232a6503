import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket
import Synchronization
import TandemWire

#if canImport(Network)
    import Network
    import NIOTransportServices
    import Security
#else
    import NIOSSL
#endif

/// The transport over SwiftNIO's WebSocket: the default on Apple platforms, where it runs over
/// Network.framework (NIOTransportServices, the system's TLS and trust store), and on Linux
/// over NIOPosix and NIOSSL. The same upgrade and framing code (NIOWebSocket's) serves both.
///
/// For example, an app that wants it on Linux too:
///
/// ```swift
/// var configuration = SyncConfiguration()
/// configuration.transport = try NIOWebSocketTransport()
/// ```
///
/// Every connection runs on one event loop of the process's shared group
/// (`MultiThreadedEventLoopGroup.singleton`, `NIOTSEventLoopGroup.singleton`): events of a
/// connection reach its handler on that loop, one at a time.
public struct NIOWebSocketTransport: WebSocketTransport {
    /// The largest message accepted from the server, after reassembly of its fragments; a
    /// larger one closes the connection with 1009. Default: 16 MiB.
    public var maxMessageBytes: Int
    /// The most bytes `send` may hold that the network has not taken yet; past it, `send`
    /// throws `backpressure`. Default: 16 MiB.
    public var maxQueuedBytes: Int
    private let bootstrap: Bootstrap

    /// - Parameter trustedCertificates: For `wss://`: a PEM file of the certificate
    ///   authorities the server's certificate must chain to; nil for the system's (on Linux,
    ///   `SSL_CERT_FILE` when set, as OpenSSL has it, else the system's bundle).
    /// - Throws: ``TransportError`` `.failed` when the certificate file cannot be read.
    public init(
        trustedCertificates: String? = nil, maxMessageBytes: Int = 16 << 20, maxQueuedBytes: Int = 16 << 20
    ) throws(TransportError) {
        self.maxMessageBytes = maxMessageBytes
        self.maxQueuedBytes = maxQueuedBytes
        bootstrap = try Bootstrap.shared(trusting: trustedCertificates)
    }

    public func connect(to url: String, handler: @escaping @Sendable (TransportEvent) -> Void) throws(TransportError)
        -> any TransportConnection
    {
        let target = try Target(url)
        let connection = Connection(handler: handler, maxQueuedBytes: maxQueuedBytes)
        let upgrade = Upgrade(target: target, maxMessageBytes: maxMessageBytes, connection: connection)
        bootstrap.connect(target, upgrade) { result in
            if case .failure(let error) = result { connection.failed(Self.describe(error, target)) }
        }
        return connection
    }

    /// What went wrong connecting, as a person would say it.
    private static func describe(_ error: any Error, _ target: Target) -> String {
        "cannot connect to \(target.url): \(error)"
    }

    // MARK: - The URL

    /// Where a connection goes.
    struct Target: Sendable {
        var url: String
        var host: String
        var port: Int
        var path: String
        var usesTLS: Bool

        init(_ url: String) throws(TransportError) {
            guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
                scheme == "ws" || scheme == "wss", let host = components.host, !host.isEmpty
            else {
                throw TransportError(.invalidURL, "'\(url)' is not a ws:// or wss:// URL")
            }
            self.url = url
            self.host = host
            usesTLS = scheme == "wss"
            port = components.port ?? (usesTLS ? 443 : 80)
            let query = components.percentEncodedQuery.map { "?" + $0 } ?? ""
            path = (components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath) + query
        }

        /// The `Host` header: the port only when it is not the scheme's own.
        var hostHeader: String {
            let name = host.contains(":") ? "[\(host)]" : host
            return port == (usesTLS ? 443 : 80) ? name : "\(name):\(port)"
        }

        /// Whether the host is an IP address (no server name to send or check; the address
        /// is checked against the certificate instead).
        var isAddress: Bool {
            host.contains(":") || host.split(separator: ".").count == 4 && host.allSatisfy { $0.isNumber || $0 == "." }
        }
    }

    // MARK: - The pipeline

    /// The HTTP upgrade, then the WebSocket handlers, on a new channel (its event loop).
    struct Upgrade: Sendable {
        let target: Target
        let maxMessageBytes: Int
        let connection: Connection

        func configure(_ channel: any Channel) throws {
            let connection = self.connection
            let maxMessageBytes = self.maxMessageBytes
            let upgrader = NIOWebSocketClientUpgrader(
                maxFrameSize: maxMessageBytes, automaticErrorHandling: true
            ) { channel, _ in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        NIOWebSocketFrameAggregator(
                            minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: .max,
                            maxAccumulatedFrameSize: maxMessageBytes),
                        FrameHandler(connection: connection),
                    ])
                }
            }
            // The request's handler goes once the server said yes, before the WebSocket
            // handlers come in behind it (it reads HTTP, not frames).
            try channel.pipeline.syncOperations.addHTTPClientHandlers(
                leftOverBytesStrategy: .forwardBytes,
                withClientUpgrade: (
                    upgraders: [upgrader],
                    completionHandler: { context in
                        context.pipeline.syncOperations.removeHandler(name: UpgradeRequest.name, promise: nil)
                    }
                ))
            try channel.pipeline.syncOperations.addHandler(
                UpgradeRequest(target: target, connection: connection), name: UpgradeRequest.name)
        }
    }

    /// Sends the upgrade request once the channel is up, and reports an upgrade the server
    /// refused (any answer but 101).
    final class UpgradeRequest: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundOut = HTTPClientRequestPart

        static let name = "tandem.upgrade-request"

        let target: Target
        let connection: Connection

        init(target: Target, connection: Connection) {
            self.target = target
            self.connection = connection
        }

        func channelActive(context: ChannelHandlerContext) {
            var headers = HTTPHeaders()
            headers.add(name: "Host", value: target.hostHeader)
            headers.add(name: "Content-Length", value: "0")
            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: target.path, headers: headers)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            context.fireChannelActive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            // Only an answer that is not the upgrade reaches here.
            if case .head(let head) = unwrapInboundIn(data) {
                connection.failed("the server at \(target.url) answered the upgrade with \(head.status.code)")
                context.close(promise: nil)
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            connection.failed("the WebSocket upgrade with \(target.url) failed: \(error)")
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            connection.failed("the server at \(target.url) closed the connection during the upgrade")
            context.fireChannelInactive()
        }
    }

    /// The open connection's frames (on the channel's event loop): whole text messages to the
    /// handler, pings answered, the close handshake.
    final class FrameHandler: ChannelInboundHandler {
        typealias InboundIn = WebSocketFrame
        typealias OutboundOut = WebSocketFrame

        let connection: Connection

        init(connection: Connection) { self.connection = connection }

        func handlerAdded(context: ChannelHandlerContext) {
            // Once the upgrade handler has left the pipeline (in the same turn of the loop, after
            // this): until then it refuses writes.
            let channel = context.channel
            let connection = self.connection
            context.eventLoop.execute { connection.opened(channel) }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let frame = unwrapInboundIn(data)
            switch frame.opcode {
            case .text:
                connection.received(Array(frame.unmaskedData.readableBytesView))
            case .ping:
                let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
                context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
            case .connectionClose:
                var data = frame.unmaskedData
                let code = data.readInteger(as: UInt16.self) ?? 1005
                let reason = data.readString(length: data.readableBytes) ?? ""
                if connection.peerClosed(code: code, reason: reason) {
                    // Its close answered with the same status, as RFC 6455 §5.5.1 asks; then the
                    // connection ends.
                    var echo = context.channel.allocator.buffer(capacity: 2)
                    echo.writeInteger(code == 1005 ? 1000 : code)
                    let frame = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: echo)
                    let channel = context.channel
                    context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in channel.close(promise: nil) }
                } else {
                    // The answer to our close.
                    context.close(promise: nil)
                }
            default:
                // Binary messages are not Tandem's; pongs need nothing.
                break
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            // NIOWebSocket's protocol error handler has sent its close (1002, 1009) already.
            connection.noteFailure("\(error)")
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            connection.ended()
            context.fireChannelInactive()
        }
    }

    // MARK: - TLS and bootstraps

    /// How connections are made: the bootstrap of the platform, with its TLS.
    struct Bootstrap: Sendable {
        let trustedCertificates: String?

        #if canImport(Network)
            static func shared(trusting path: String?) throws(TransportError) -> Bootstrap {
                if let path, !FileManager.default.isReadableFile(atPath: path) {
                    throw TransportError(.failed, "cannot read the trusted certificates file \(path)")
                }
                return Bootstrap(trustedCertificates: path)
            }

            func connect(
                _ target: Target, _ upgrade: Upgrade, completion: @escaping @Sendable (Result<Void, any Error>) -> Void
            ) {
                var bootstrap = NIOTSConnectionBootstrap(group: NIOTSEventLoopGroup.singleton)
                    .connectTimeout(.seconds(10))
                    .channelOption(NIOTSChannelOptions.waitForActivity, value: false)
                if target.usesTLS {
                    bootstrap = bootstrap.tlsOptions(
                        AppleTrust.options(for: target.host, trusting: trustedCertificates))
                }
                bootstrap
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture { try upgrade.configure(channel) }
                    }
                    .connect(host: target.host, port: target.port)
                    .whenComplete { result in completion(result.map { _ in () }) }
            }
        #else
            let context: NIOSSLContext

            /// One TLS context per set of trusted authorities, for the whole process: making one
            /// reads and parses the certificates.
            private static let contexts = Mutex<[String: NIOSSLContext]>([:])

            static func shared(trusting path: String?) throws(TransportError) -> Bootstrap {
                let roots = path ?? ProcessInfo.processInfo.environment["SSL_CERT_FILE"]
                let key = roots ?? ""
                if let known = contexts.withLock({ $0[key] }) {
                    return Bootstrap(trustedCertificates: path, context: known)
                }
                var configuration = TLSConfiguration.makeClientConfiguration()
                if let roots {
                    guard FileManager.default.isReadableFile(atPath: roots) else {
                        throw TransportError(.failed, "cannot read the trusted certificates file \(roots)")
                    }
                    configuration.trustRoots = .file(roots)
                }
                do {
                    let context = try NIOSSLContext(configuration: configuration)
                    contexts.withLock { $0[key] = context }
                    return Bootstrap(trustedCertificates: path, context: context)
                } catch {
                    throw TransportError(
                        .failed, "cannot set up TLS with \(roots ?? "the system's authorities"): \(error)")
                }
            }

            func connect(
                _ target: Target, _ upgrade: Upgrade, completion: @escaping @Sendable (Result<Void, any Error>) -> Void
            ) {
                let context = self.context
                ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .connectTimeout(.seconds(10))
                    .channelOption(.socketOption(.tcp_nodelay), value: 1)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            if target.usesTLS {
                                // A name is sent (SNI) and checked; an address is checked against the
                                // certificate's IP addresses.
                                try channel.pipeline.syncOperations.addHandler(
                                    NIOSSLClientHandler(
                                        context: context, serverHostname: target.isAddress ? nil : target.host))
                            }
                            try upgrade.configure(channel)
                        }
                    }
                    .connect(host: target.host, port: target.port)
                    .whenComplete { result in completion(result.map { _ in () }) }
            }
        #endif
    }

    // MARK: - The connection

    /// One connection's state, shared by the caller's threads and the channel's event loop.
    final class Connection: TransportConnection {
        private let handler: @Sendable (TransportEvent) -> Void
        private let maxQueuedBytes: Int
        private let state = Mutex(State())

        private struct State {
            var phase = Phase.connecting
            /// Messages sent before the open, in order.
            var waiting: [[UInt8]] = []
            /// Bytes given to the channel (or waiting) that the network has not taken yet.
            var queuedBytes = 0
            var channel: (any Channel)?
            /// A close asked for before the open: sent once it opens.
            var closeAsked: (code: UInt16, reason: String)?
            var aborted = false
            /// How it ended, for the one `.closed` event.
            var cause: TransportClose?
            var closedSent = false
        }

        enum Phase { case connecting, open, closing, closed }

        init(handler: @escaping @Sendable (TransportEvent) -> Void, maxQueuedBytes: Int) {
            self.handler = handler
            self.maxQueuedBytes = maxQueuedBytes
        }

        var isOpen: Bool { state.withLock { $0.phase == .open } }

        func send(text: [UInt8]) throws(TransportError) {
            let channel = try state.withLock { (state) throws(TransportError) -> (any Channel)? in
                guard state.phase == .connecting || state.phase == .open else {
                    throw TransportError(.notOpen, "the connection is closed")
                }
                guard state.queuedBytes == 0 || state.queuedBytes + text.count <= maxQueuedBytes else {
                    throw TransportError(
                        .backpressure, "\(state.queuedBytes) bytes wait for the server already; it is not reading")
                }
                state.queuedBytes += text.count
                if state.phase == .connecting {
                    state.waiting.append(text)
                    return nil
                }
                return state.channel
            }
            if let channel { write(text, on: channel) }
        }

        /// Writes a text message; its bytes count as queued until the network took them.
        private func write(_ text: [UInt8], on channel: any Channel) {
            let frame = WebSocketFrame(
                fin: true, opcode: .text, maskKey: .random(), data: channel.allocator.buffer(bytes: text))
            channel.writeAndFlush(frame).whenComplete { [self] _ in
                state.withLock { $0.queuedBytes -= text.count }
            }
        }

        func close(code: UInt16, reason: String) {
            let channel = state.withLock { state -> (any Channel)? in
                switch state.phase {
                case .connecting:
                    state.phase = .closing
                    state.closeAsked = (code, reason)
                    state.cause = TransportClose(code: code, reason: reason)
                    return nil
                case .open:
                    state.phase = .closing
                    state.cause = TransportClose(code: code, reason: reason)
                    return state.channel
                case .closing, .closed:
                    return nil
                }
            }
            if let channel { sendClose(code: code, reason: reason, on: channel) }
        }

        /// Writes a close frame; the server's answer ends the connection, or five seconds do.
        private func sendClose(code: UInt16, reason: String, on channel: any Channel) {
            var data = channel.allocator.buffer(capacity: 2 + reason.utf8.count)
            data.writeInteger(code)
            data.writeBytes(reason.utf8.prefix(123))
            let frame = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: data)
            channel.writeAndFlush(frame, promise: nil)
            channel.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
        }

        func abort() {
            let channel = state.withLock { state -> (any Channel)? in
                guard state.phase != .closed else { return nil }
                state.phase = .closing
                state.aborted = true
                state.waiting = []
                if state.cause == nil {
                    state.cause = TransportClose(code: 1006, reason: "the connection was dropped")
                }
                return state.channel
            }
            channel?.close(promise: nil)
        }

        // MARK: Event loop

        /// The upgrade is done: what waited goes out, in order.
        func opened(_ channel: any Channel) {
            Confinement.check(channel.eventLoop.inEventLoop, "the connection opened off its channel's event loop")
            let (waiting, close, aborted) = state.withLock { state in
                state.channel = channel
                if state.phase == .connecting { state.phase = .open }
                defer { state.waiting = [] }
                return (state.waiting, state.closeAsked, state.aborted)
            }
            if aborted {
                channel.close(promise: nil)
                return
            }
            for text in waiting { write(text, on: channel) }
            if let close { sendClose(code: close.code, reason: close.reason, on: channel) }
        }

        /// A message, unless this side closed the connection meanwhile: what comes after
        /// `close()` or `abort()` is not the caller's any more (nor after the server's close).
        func received(_ text: [UInt8]) {
            guard state.withLock({ $0.phase == .open }) else { return }
            handler(.text(text))
        }

        /// The server's close frame. Returns whether to answer it (it began the close).
        func peerClosed(code: UInt16, reason: String) -> Bool {
            state.withLock { state in
                let began = state.phase == .open
                if began {
                    state.phase = .closing
                    state.cause = TransportClose(code: code, reason: reason)
                }
                return began
            }
        }

        /// Why the channel is about to end, when nothing else said (a protocol error).
        func noteFailure(_ reason: String) {
            state.withLock { state in
                if state.cause == nil { state.cause = TransportClose(code: 1006, reason: reason) }
            }
        }

        /// The channel ended: the one `.closed` event.
        func ended() {
            let close = state.withLock { state -> TransportClose? in
                guard !state.closedSent else { return nil }
                state.closedSent = true
                state.phase = .closed
                state.channel = nil
                return state.cause ?? TransportClose(code: 1006, reason: "the connection was lost")
            }
            if let close { handler(.closed(close)) }
        }

        /// The connection never opened.
        func failed(_ reason: String) {
            let close = state.withLock { state -> TransportClose? in
                guard !state.closedSent, state.channel == nil else { return nil }
                state.closedSent = true
                state.phase = .closed
                state.waiting = []
                return TransportClose(code: 1006, reason: reason, failedToConnect: true)
            }
            if let close { handler(.closed(close)) }
        }
    }
}

#if canImport(Network)
    /// Network.framework's TLS for `wss://`: the system's trust store, or only the authorities of
    /// a PEM file (``SyncConfiguration/trustedCertificates``). With a file, the server's name is
    /// checked by the SSL policy set on the trust (an IP address against the certificate's
    /// addresses), as the system checks it without one.
    enum AppleTrust {
        /// Certificates are immutable and Core Foundation's reference counts thread-safe.
        private struct Anchors: @unchecked Sendable {
            let certificates: [SecCertificate]
        }

        static func options(for host: String, trusting path: String?) -> NWProtocolTLS.Options {
            let options = NWProtocolTLS.Options()
            guard let path, let certificates = certificates(inPEMFile: path), !certificates.isEmpty else {
                return options
            }
            let anchors = Anchors(certificates: certificates)
            sec_protocol_options_set_verify_block(
                options.securityProtocolOptions,
                { _, trust, complete in
                    let trust = sec_trust_copy_ref(trust).takeRetainedValue()
                    SecTrustSetPolicies(trust, SecPolicyCreateSSL(true, host as CFString))
                    SecTrustSetAnchorCertificates(trust, anchors.certificates as CFArray)
                    SecTrustSetAnchorCertificatesOnly(trust, true)
                    complete(SecTrustEvaluateWithError(trust, nil))
                }, DispatchQueue.global())
            return options
        }

        /// The certificates of a PEM file (its `BEGIN CERTIFICATE` blocks).
        static func certificates(inPEMFile path: String) -> [SecCertificate]? {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
            return text.components(separatedBy: "-----BEGIN CERTIFICATE-----").dropFirst().compactMap { block in
                let body = block.components(separatedBy: "-----END CERTIFICATE-----")[0].filter { !$0.isWhitespace }
                return Data(base64Encoded: body).flatMap { SecCertificateCreateWithData(nil, $0 as CFData) }
            }
        }
    }
#endif
